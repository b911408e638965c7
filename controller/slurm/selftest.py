"""The collective self-test of `faultlens node-check --self-test N`: a gloo all_reduce across N
local ranks, as the node's ranks would run one, within a few seconds.

Each rank is its own process (`python -m faultlens.controller.slurm.selftest`, the rendezvous on
a free loopback port), contributes rank + 1, and must see the sum N (N + 1) / 2; the test passes
when every rank saw it and exited 0 within the timeout. What it proves: torch and gloo start on
the node, its processes rendezvous and a collective completes among them. It runs on the CPU (a
node whose GPUs are in doubt is still tested).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

#: seconds the whole test may take (process starts and torch's import included)
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SelfTest:
    ranks: int
    ok: bool
    seconds: float
    detail: str

    def text(self) -> str:
        state = "ok" if self.ok else "FAILED"
        return f"all_reduce across {self.ranks} local ranks {state} in {self.seconds:.1f}s" + (
            "" if self.ok else f": {self.detail}"
        )

    def to_dict(self) -> dict:
        return {
            "ranks": self.ranks,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def collective_self_test(ranks: int, timeout_s: float = TIMEOUT_S) -> SelfTest:
    """Run the all_reduce across `ranks` local processes; never raises."""
    started = time.monotonic()
    if ranks < 1:
        return SelfTest(ranks, False, 0.0, "needs at least one rank")
    port = _free_port()
    procs = []
    try:
        for rank in range(ranks):
            env = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(ranks),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "faultlens.controller.slurm.selftest", f"{timeout_s:g}"],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
    except OSError as exc:
        _stop(procs)
        return SelfTest(ranks, False, time.monotonic() - started, f"cannot start a rank: {exc}")
    outputs: list[tuple[int, str, str]] = []
    deadline = started + timeout_s
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(procs)
            return SelfTest(
                ranks,
                False,
                time.monotonic() - started,
                f"rank {rank} did not finish within {timeout_s:g}s",
            )
        outputs.append((proc.returncode, out, err))
    seconds = time.monotonic() - started
    expected = ranks * (ranks + 1) / 2
    for rank, (code, out, err) in enumerate(outputs):
        if code != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            return SelfTest(ranks, False, seconds, f"rank {rank} exited {code}: {last[:300]}")
        try:
            total = float(json.loads(out.strip().splitlines()[-1])["sum"])
        except (ValueError, KeyError, IndexError):
            return SelfTest(ranks, False, seconds, f"rank {rank} reported no sum")
        if total != expected:
            return SelfTest(ranks, False, seconds, f"rank {rank} saw {total:g}, not {expected:g}")
    return SelfTest(ranks, True, seconds, f"every rank saw {expected:g}")


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _rank_main() -> int:
    """One rank of the test (environment from collective_self_test)."""
    import datetime as dt

    import torch
    import torch.distributed as dist

    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else TIMEOUT_S
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=timeout))
    try:
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        print(json.dumps({"rank": dist.get_rank(), "sum": float(value.item())}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main())
