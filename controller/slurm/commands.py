"""The Slurm commands faultlens runs, behind one class: each call has a deadline, its stderr kept
for the error, and `scontrol show -o` records parsed into dicts. The environment (SLURM_CONF) and
the programs' directory are arguments, so a test cluster and a site's cluster look the same."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from faultlens.errors import FaultlensError


class SlurmCommandError(RuntimeError, FaultlensError):
    """A Slurm command failed (exit status or deadline); the message holds its stderr."""


_KEY = re.compile(r" (?=[A-Za-z][A-Za-z0-9_:/]*=)")


def parse_record(line: str) -> dict[str, str]:
    """One `scontrol show job|node -o` line -> {key: value}; a value may hold spaces (Reason,
    Comment), so a new key starts only at ` Key=`."""
    record: dict[str, str] = {}
    for part in _KEY.split(line.strip()):
        key, _, value = part.partition("=")
        if key:
            record[key] = value.strip()
    return record


@dataclass(frozen=True)
class Slurm:
    """Runs Slurm's client commands. `env`: extra environment (e.g. SLURM_CONF); `bin_dir`: where
    the programs are (None: PATH)."""

    env: Mapping[str, str] | None = None
    bin_dir: str | None = None
    timeout_s: float = 30.0

    def run(self, *argv: str) -> str:
        program = os.path.join(self.bin_dir, argv[0]) if self.bin_dir else argv[0]
        env = {**os.environ, **(self.env or {})}
        try:
            result = subprocess.run(
                [program, *argv[1:]],
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise SlurmCommandError(f"{argv[0]}: not installed (no such program)") from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(
                f"{' '.join(argv)}: no answer within {self.timeout_s:g}s"
            ) from None
        if result.returncode != 0:
            err = " ".join(result.stderr.split())[:300] or f"exit {result.returncode}"
            raise SlurmCommandError(f"{' '.join(argv[:3])}: {err}")
        return result.stdout

    # -- reading ------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, str]]:
        out = self.run("scontrol", "show", "job", "-o")
        return [parse_record(line) for line in out.splitlines() if line.startswith("JobId=")]

    def job(self, job_id: str) -> dict[str, str]:
        return parse_record(self.run("scontrol", "show", "job", "-o", job_id))

    def job_named(self, name: str) -> dict[str, str] | None:
        """The newest Slurm job whose name is `name` (faultlens' stable job id), or None."""
        named = [j for j in self.jobs() if j.get("JobName") == name]
        return max(named, key=lambda j: int(j["JobId"])) if named else None

    def node(self, name: str) -> dict[str, str]:
        return parse_record(self.run("scontrol", "show", "node", "-o", name))

    def hostnames(self, nodelist: str) -> list[str]:
        if not nodelist or nodelist == "(null)":
            return []
        return self.run("scontrol", "show", "hostnames", nodelist).split()

    # -- acting -------------------------------------------------------------------------------
    def update(self, kind: str, ident: str, **fields: str) -> None:
        self.run(
            "scontrol",
            "update",
            f"{kind}={ident}",
            *(f"{key}={value}" for key, value in fields.items()),
        )

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        if nodes:
            self.update("NodeName", ",".join(nodes), State="DRAIN", Reason=reason)

    def resume(self, nodes: Sequence[str], reason: str) -> None:
        if nodes:
            self.update("NodeName", ",".join(nodes), State="RESUME", Reason=reason)
