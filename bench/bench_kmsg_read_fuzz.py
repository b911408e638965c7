"""Fuzzing the kernel-log file reader (`read_kernel_log`, what `faultlens ingest kmsg` runs): whole
files, not lines (bench/bench_parse_fuzz.py fuzzes the line parser).

    PYTHONPATH=. python -m bench.bench_kmsg_read_fuzz [--n 20000] [--seed 37] [--write]

Each input is a mutant of a real node's kern.log (tests/data/gpu/node-kern.log) followed by an
intact copy of it (the sentinel): blocks of NUL bytes, random bytes or bytes that are not UTF-8
inserted at a line boundary or inside a line, lines just under, at and over the longest line kept
(64 KiB) and of several MB, newlines removed (lines joined), CRLF and lone CR endings, a byte order
mark, truncation inside a line, repeated lines, journald JSON objects cut or spliced. Counted:
crashes (any exception but the reader's one-line KernelLogFileError naming the file), refusals
(that error), lost lines (the sentinel's GPU events not all read: one bad part hid good lines),
silent skips (a line over 64 KiB, a NUL or a non-UTF-8 byte in the file and no note or bad line
saying so), peak RSS and the worst CPU seconds per MB (inputs of 256 KB and more).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from faultlens.collectors.sources.kmsg import KernelLogFileError, read_kernel_log  # noqa: E402
from faultlens.collectors.sources.source import NodeIdentity  # noqa: E402

REAL = (REPO / "tests" / "data" / "gpu" / "node-kern.log").read_bytes()
NODE = NodeIdentity("fuzz")
MAX_LINE = 64 * 1024


def _key(row: dict[str, Any]) -> tuple:
    return (row["kind"], row["code"], row["pci_bus_id"], row["raw"])


def _mutate(rng: random.Random) -> bytes:
    lines = REAL.split(b"\n")
    kind = rng.randrange(12)
    at = rng.randrange(len(lines))
    if kind == 0:
        lines.insert(at, b"\x00" * rng.choice([1, 100, 4096, 1 << 20]))
    elif kind == 1:
        lines.insert(at, os.urandom(rng.choice([1, 64, 4096, 200_000])))
    elif kind == 2:
        line = lines[at]
        cut = rng.randrange(len(line) + 1)
        lines[at] = line[:cut] + rng.choice([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\x80" * 9,
                                             b"\xf4\x90\x80\x80"]) + line[cut:]
    elif kind == 3:
        size = rng.choice([MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 3 << 20])
        lines.insert(at, (b"NVRM: Xid " * (size // 10 + 1))[:size])
    elif kind == 4:
        joined = rng.randrange(1, 5)
        lines[at:at + joined] = [b"".join(lines[at:at + joined])]
    elif kind == 5:
        ending = rng.choice([b"\r\n", b"\r"])
        return ending.join(lines) + b"\n"
    elif kind == 6:
        return b"\xef\xbb\xbf" + REAL
    elif kind == 7:
        data = b"\n".join(lines)
        return data[:rng.randrange(len(data))]
    elif kind == 8:
        lines[at:at] = [lines[at]] * rng.choice([2, 100, 5000])
    elif kind == 9:
        obj = {"MESSAGE": lines[at].decode("utf-8", "replace"), "__REALTIME_TIMESTAMP": "1"}
        text = json.dumps(obj).encode()
        lines[at] = text[:rng.randrange(len(text) + 1)]
    elif kind == 10:
        line = lines[at]
        spot = rng.randrange(len(line) + 1)
        lines[at] = line[:spot] + bytes([rng.randrange(256)]) + line[spot:]
    else:
        for _ in range(rng.randrange(1, 20)):
            i = rng.randrange(len(lines))
            lines[i] = os.urandom(rng.randrange(1, 200))
    return b"\n".join(lines)


def _needs_note(data: bytes) -> bool:
    if b"\x00" in data:
        return True
    if any(len(line) > MAX_LINE for line in data.split(b"\n")):
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def run(n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    counts: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="kmsg-fuzz-") as tmp:
        path = Path(tmp) / "kern.log"
        path.write_bytes(REAL)
        real = collections.Counter(_key(r) for r in read_kernel_log(path, NODE).rows)
        worst = 0.0
        first: dict[str, str] = {}
        for i in range(n):
            mutant = _mutate(rng)
            data = mutant + b"\n" + REAL
            path.write_bytes(data)
            started = time.process_time()
            try:
                result = read_kernel_log(path, NODE)
            except KernelLogFileError as exc:
                counts["refused"] += 1
                if "\n" in str(exc) or str(path) not in str(exc):
                    counts["crashes"] += 1
                    first.setdefault("crash", f"{i}: {str(exc)[:200]!r}")
                continue
            except Exception as exc:  # what the bench counts
                counts["crashes"] += 1
                first.setdefault("crash", f"{i}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            spent = time.process_time() - started
            if len(data) >= 256 << 10:  # (smaller ones are the fixed cost of a call)
                worst = max(worst, spent / (len(data) / 1e6))
            got = collections.Counter(_key(r) for r in result.rows)
            if any(got[k] < v for k, v in real.items()):
                counts["lost_lines"] += 1
                first.setdefault("lost", f"{i}")
            if _needs_note(data) and not result.notes and not result.stats.bad_lines:
                counts["silent_skips"] += 1
                first.setdefault("silent", f"{i}")
            counts["read"] += 1
    return {"inputs": n, "read": counts["read"], "refused": counts["refused"],
            "crashes": counts["crashes"], "lost_lines": counts["lost_lines"],
            "silent_skips": counts["silent_skips"], "worst_cpu_s_per_mb": round(worst, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "first": first}


def _section(result: dict[str, Any], n: int, seed: int, load: str) -> Any:
    import subprocess

    from bench.common import Figure, Section

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "-"
    date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    return Section(
        title="Kernel-log file reader under fuzzing",
        compares=("Whole-file mutants of a real node's kern.log, each followed by an intact copy "
                  "(the sentinel), through read_kernel_log (what `faultlens ingest kmsg` runs). "
                  "A crash is any exception but the one-line, file-naming KernelLogFileError; a "
                  "lost line a sentinel GPU event not read; a silent skip a long line, NUL or "
                  "non-UTF-8 byte with neither a note nor a bad line counted."),
        commands=(f"PYTHONPATH=. python -m bench.bench_kmsg_read_fuzz --n {n} --seed {seed} "
                  "--write",),
        figures=(
            Figure(f"{n:,} inputs ({result['read']:,} read, {result['refused']:,} refused): "
                   "crashes, lost lines, silent skips",
                   f"{result['crashes']}, {result['lost_lines']}, {result['silent_skips']}", "0",
                   commit=commit, date=date),
            Figure("peak RSS; worst CPU s per MB of input (inputs >= 256 KB)",
                   f"{result['peak_rss_mb']} MB; {result['worst_cpu_s_per_mb']} s", "-",
                   commit=commit, date=date),
        ),
        notes=(f"Shared 2-core machine at load {load}: CPU seconds, not wall time. CI runs 150 "
               "inputs (tests/test_hostile_kmsg_files.py); the full-size files (GBs, a 300 MB "
               "line) are bench/bench_reader_budgets.py's.",),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--write", action="store_true", help="publish in docs/benchmarks.md")
    args = parser.parse_args(argv)
    load = f"{os.getloadavg()[0]:.0f}"
    result = run(args.n, args.seed)
    print(json.dumps(result))
    if args.write:
        from bench.common import write_section

        write_section(REPO / "docs" / "benchmarks.md", _section(result, args.n, args.seed, load))
    bad = result["crashes"] + result["lost_lines"] + result["silent_skips"]
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
