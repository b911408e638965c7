"""The test suite's wall time, serial (the README's `python -m pytest -q`) beside pytest-xdist
(`-n N --dist loadfile`: every test of a file on one worker, so module-scoped fixtures are made
once), in one run, with the CPU seconds the runs used and the load around them.

    python -m bench.bench_suite                         # the whole suite, serial then -n 2
    python -m bench.bench_suite --workers 2 -- tests/test_policy.py tests/test_kmsg.py
    python -m bench.bench_suite --write                 # publish the section in docs/benchmarks.md

CPU seconds are the pytest process' and every process it waited for (RUSAGE_CHILDREN), so a
parallel run that only overlaps waits uses about the CPU of the serial one. The session fixtures
that cache on disk under the temporary directory (torch artifacts, hang corpus, held-out set, the
straggler and user-script jobs) are warm for the second run unless `--cold` gives each run a fresh
TMPDIR, as a clean CI machine has.

Why loadfile and not loadgroup: with pytest 9.2 and xdist 3.8 a node id comes from `Node._id`, and
xdist's loadgroup still renames `_nodeid`, so `xdist_group` marks are silently ignored (checked:
two files marked with one group ran on both workers).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Figure, Section, write_section

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "benchmarks.md"
TITLE = "Test suite: serial beside pytest-xdist"


@dataclass(frozen=True)
class SuiteRun:
    label: str
    wall_s: float
    cpu_s: float
    load_before: float
    load_after: float
    summary: str
    returncode: int


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_suite(label: str, extra: list[str], paths: list[str], cold: bool) -> SuiteRun:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if cold:  # the test caches live under the temporary directory
        env["TMPDIR"] = tempfile.mkdtemp(prefix="faultlens-suite-bench-")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *paths]
    load_before = os.getloadavg()[0]
    cpu0, wall0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - wall0, _children_cpu() - cpu0
    lines = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return SuiteRun(
        label,
        wall,
        cpu,
        load_before,
        os.getloadavg()[0],
        lines[-1].strip("= ") if lines else proc.stdout[-300:],
        proc.returncode,
    )


def _commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    return proc.stdout.strip() or "-"


def section(serial: SuiteRun, parallel: SuiteRun, workers: int, paths: list[str]) -> Section:
    what = " ".join(paths) if paths else "the whole suite"
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    commit = _commit()
    return Section(
        title=TITLE,
        compares=f"Wall and CPU seconds of {what}: `python -m pytest -q` (the README's command) "
        f"beside `-n {workers} --dist loadfile`, one after the other in one run.",
        commands=(
            f"python -m bench.bench_suite --workers {workers} --write"
            + (f" -- {' '.join(paths)}" if paths else ""),
        ),
        figures=(
            Figure(
                f"wall, -n {workers} --dist loadfile",
                f"{parallel.wall_s:.0f} s",
                "-",
                f"serial {serial.wall_s:.0f} s",
                f"{serial.wall_s / parallel.wall_s:.2f}",
                commit,
                date,
            ),
            Figure(
                f"CPU, -n {workers} --dist loadfile",
                f"{parallel.cpu_s:.0f} s",
                "-",
                f"serial {serial.cpu_s:.0f} s",
                f"{serial.cpu_s / parallel.cpu_s:.2f}",
                commit,
                date,
            ),
        ),
        notes=(
            f"{os.cpu_count()} cores; 1-minute load {serial.load_before:.1f} -> "
            f"{serial.load_after:.1f} around the serial run, {parallel.load_before:.1f} -> "
            f"{parallel.load_after:.1f} around the parallel one; on a loaded machine a second "
            "worker also wins a second share of the CPU, so the ratio there overstates what an "
            "idle CI machine gains.",
            f"serial: {serial.summary}; parallel: {parallel.summary}",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--cold", action="store_true", help="a fresh TMPDIR (so cold test caches) for each run"
    )
    parser.add_argument("--write", action="store_true", help=f"publish the section in {DOC}")
    parser.add_argument("paths", nargs="*", help="test files (default: the whole suite)")
    args = parser.parse_args(argv)
    serial = run_suite("serial", [], args.paths, args.cold)
    print(serial)
    parallel = run_suite(
        f"-n {args.workers}", ["-n", str(args.workers), "--dist", "loadfile"], args.paths, args.cold
    )
    print(parallel)
    result = section(serial, parallel, args.workers, args.paths)
    if args.write:
        write_section(DOC, result)
        print(f"wrote the section {TITLE!r} of {DOC}")
    return 0 if serial.returncode == parallel.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
