"""Run one CLI command many times, each a fresh process, and count how each exited: the check that
a command which printed its whole output also exits cleanly (no "terminate called without an active
exception", rc 134, from a native thread torn down at interpreter exit). Counted, not timed.

    PYTHONPATH=. python -m bench.cli_exit_loop --runs 500 --store S [--jobs 2] [--publish]

The command is `faultlens decisions --store S --json` unless given after `--`. A run is clean when
its rc is 0, its stderr is empty and its stdout is complete (for --json: parses as JSON). --publish
writes the section "CLI exit: N runs of one command" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import Figure, Section, emit, machine, write_section

REPO = Path(__file__).resolve().parents[1]
TITLE = "CLI exit: N runs of one command, each a fresh process"


def _run(command: list[str], env: dict[str, str], timeout: float) -> dict[str, object]:
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "stderr": "", "complete": False}
    complete = bool(proc.stdout)
    if "--json" in command:
        try:
            json.loads(proc.stdout)
        except ValueError:
            complete = False
    return {"rc": proc.returncode, "stderr": proc.stderr.strip(), "complete": complete}


def loop(
    command: list[str], runs: int, jobs: int, timeout: float = 1800.0, log: Path | None = None
) -> dict[str, object]:
    """Run `command` `runs` times, `jobs` at a time; each run's result also appended to `log`
    (JSON lines) as it ends, and every unclean run told on stderr at once."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    done = []

    def one(_: int) -> dict[str, object]:
        result = _run(command, env, timeout)
        done.append(result)
        if result["rc"] != 0 or result["stderr"] or not result["complete"]:
            print(
                f"run {len(done)}: rc {result['rc']}, complete output {result['complete']}, "
                f"stderr: {str(result['stderr'])[-300:]!r}",
                file=sys.stderr,
                flush=True,
            )
        if log is not None:
            with open(log, "a") as handle:
                handle.write(json.dumps(result) + "\n")
        if len(done) % 50 == 0:
            bad = sum(1 for r in done if r["rc"] != 0)
            print(f"{len(done)} runs, {bad} not rc 0", file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, range(runs)))
    return summarise(results, time.monotonic() - started, jobs)


def summarise(results: list[dict[str, object]], wall_s: float, jobs: int) -> dict[str, object]:
    runs = len(results)
    codes = collections.Counter(str(r["rc"]) for r in results)
    stderr = collections.Counter(str(r["stderr"]).splitlines()[-1] for r in results if r["stderr"])
    clean = sum(1 for r in results if r["rc"] == 0 and not r["stderr"] and r["complete"])
    return {
        "runs": runs,
        "clean": clean,
        "aborts": sum(1 for r in results if r["rc"] in (134, -6)),
        "terminate_messages": sum(1 for r in results if "terminate called" in str(r["stderr"])),
        "incomplete_output": sum(1 for r in results if not r["complete"]),
        "exit_codes": dict(codes),
        "stderr_last_lines": dict(stderr.most_common(5)),
        "wall_s": round(wall_s, 1),
        "jobs": jobs,
    }


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"


def section(result: dict[str, object], shown: str, args: argparse.Namespace) -> Section:
    runs = result["runs"]
    date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    commit = _commit()
    figures = (
        Figure(
            f"`{shown}`: clean exits (rc 0, nothing on stderr, whole JSON on stdout)",
            f"{result['clean']} of {runs}",
            f"{runs} of {runs}",
            "-",
            "-",
            commit,
            date,
        ),
        Figure(
            "aborts at exit (rc 134, 'terminate called without an active exception')",
            str(result["aborts"]),
            "0",
            "-",
            "-",
            commit,
            date,
        ),
        Figure(
            "exit codes seen",
            ", ".join(f"{k}: {v}" for k, v in sorted(result["exit_codes"].items())),
            "0 only",
            "-",
            "-",
            commit,
            date,
        ),
    )
    notes = (
        f"{args.jobs} run(s) at a time on {machine()['cores']} cores (load from other work "
        f"on the machine as it came), {result['wall_s']} s in all.",
        "The abort came from Arrow's parquet reader on a Python file object: DecisionLog read each "
        "decisions segment through fsspec's open() into pq.ParquetFile, so Arrow's I/O threads "
        "called back into Python; one still running as the interpreter finalised could not take "
        "the GIL and was unwound through a noexcept C++ frame. The log now hands Arrow the path "
        "on a local store (a native file, no Python callback) and a buffer read whole on an object "
        "store.",
    )
    return Section(
        TITLE,
        "Counts, not timings: each run a fresh `python -m "
        "faultlens.controller.cli.main` process over the demo's store "
        "(`faultlens demo`); "
        "a run is clean when it exits 0 with its whole output and nothing on stderr.",
        (
            f"PYTHONPATH=. python -m bench.cli_exit_loop --runs {runs} --jobs {args.jobs} "
            "--store STORE --publish",
        ),
        figures,
        notes,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--store", help="the store the default command reads")
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds one run may take (a loaded machine starves them)",
    )
    parser.add_argument("--log", help="append each run's result here (JSON lines)")
    parser.add_argument(
        "--from-log",
        metavar="FILE",
        help="run nothing: summarise (and --publish) the runs a --log holds",
    )
    parser.add_argument(
        "--publish", action="store_true", help="write the section of docs/benchmarks.md"
    )
    parser.add_argument(
        "command",
        nargs="*",
        help="the command (after --), default: faultlens decisions --store STORE --json",
    )
    args = parser.parse_args(argv)
    if args.command or args.from_log:
        command, shown = args.command, " ".join(args.command) or "faultlens decisions --json"
    else:
        if not args.store:
            parser.error("--store STORE (or a command after --)")
        command = [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "decisions",
            "--store",
            args.store,
            "--json",
        ]
        shown = "faultlens decisions --json"
    if args.from_log:  # run nothing: summarise the runs a (stopped) loop logged
        logged = Path(args.from_log).read_text().splitlines()
        result = summarise([json.loads(line) for line in logged if line.strip()], 0.0, args.jobs)
    else:
        result = loop(
            command,
            args.runs,
            args.jobs,
            timeout=args.timeout,
            log=Path(args.log) if args.log else None,
        )
    emit("cli_exit_loop", {"command": shown, **result})
    if args.publish:
        write_section(REPO / "docs" / "benchmarks.md", section(result, shown, args))
    return 0 if result["clean"] == result["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
