"""Why a supervised job failed to start: the first error line of its worker logs (torchrun --log-dir
<node>/<run>/attempt_<n>/<local rank>/stderr.log) or of its torchrun agents' stderr, and the file it
is in.

`faultlens run` prints it when an attempt ended before its first step (torch missing, a typo in the
script path, a bad argument), instead of leaving the cause in a file nobody is pointed to."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 1 << 20  # read at most this much of each log

# lines that say what went wrong, most telling first
_ERROR = re.compile(
    r"can't open file|No module named|Error while finding module|No such file or "
    r"directory|Permission denied"
    r"|^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b:?|: error: |^error: |^fatal: |Killed$",
)
# torchrun's own machinery: what every failure prints, never the cause
_NOISE = re.compile(
    r"ChildFailedError|SignalException|^\s*File "
    r"\"|^Traceback|^\s*\^+\s*$|torch\.distributed\.elastic|"
    r"errors/__init__\.py|To enable traceback|^\s*(raise|return|exitcode|error_file|traceback)\b|"
    r"^\s*\[?W\d{4}|UserWarning|FutureWarning|DeprecationWarning",
)
_PREFIX = re.compile(r"^\[default\d+\]:|^\[rank\d+\]:")


@dataclass(frozen=True)
class StartFailure:
    line: str
    path: Path


def _lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES)
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def first_error(attempt_dir: Path) -> StartFailure | None:
    """The first error line of the workers' stderr logs, else of the agents' stderr; None when there
    is none.
    """
    attempt_dir = Path(attempt_dir)
    workers = sorted(attempt_dir.glob("logs/*/**/stderr.log"))
    agents = sorted(attempt_dir.glob("torchrun-*.stderr"))
    for group in (workers, agents):
        for path in group:
            for raw in _lines(path):
                line = _PREFIX.sub("", raw).strip()
                if line and _ERROR.search(line) and not _NOISE.search(line):
                    return StartFailure(line[:400], path)
    return None


def start_failure_lines(workdir: Path, attempt: int) -> list[str]:
    """What `faultlens run` prints for an attempt that never reached a step."""
    attempt_dir = Path(workdir) / f"attempt-{attempt}"
    found = first_error(attempt_dir)
    if found is None:
        logs = attempt_dir / "logs"
        return [f"attempt {attempt} ended before its first step; its logs: "
                f"{logs if logs.exists() else attempt_dir}"]
    from faultlens.controller.report.wording import short_path

    return [f"attempt {attempt} failed to start: {found.line}", f"  in {short_path(found.path)}"]
