"""Fuzzing the GPU-health parsers: the kernel-log parser and the dcgm-exporter scrape parser, on
mutants of real lines (tests/data/gpu/: a real node's kern.log, real dcgm-exporter scrapes of both
metric-name generations).

    python -m bench.bench_parse_fuzz [--kmsg 100000] [--dcgm 100000] [--seed 16]

Each input goes through what a poll does with it: parse, rows, Arrow batch
(collectors/store/row_guard.py). Counted: crashes (an exception escaping `KernelLogParser.feed` /
`DcgmParser.parse`, which say they never raise), internal errors the parsers contained (a bad line
whose reason is an exception type), bad lines, rows the batch refused, peak RSS, the slowest input
and the worst time per KB over inputs of at least 1 KB (64 KB is the longest line the kernel-log
parser accepts). Mutations: byte flips / inserts / deletes, numbers swapped for extreme ones
(20-digit pids, 1e303, years 9999), padding and repeated fragments up to 64 KB (the shapes that
backtracked quadratically), lone surrogates, journald JSON with odd fields, spliced lines, and for
dcgm extreme values, labels and timestamps.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import emit, machine, peak_rss_mb
from faultlens.collectors.sources.dcgm import DcgmParser
from faultlens.collectors.sources.kmsg import KernelLogParser, events_to_rows
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "gpu"
IDENTITY = NodeIdentity("fuzz-node")
MAX_LINE = 64 * 1024

# real driver lines (docs/reference/gpu-signals.md, the examples tests/test_kmsg.py checks), beside
# node-kern.log
REFERENCE_LINES = [
    "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
    "error (DBE) has "
    "been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset "
    "gpu to activate.",
    "NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. MMU "
    "Fault: ENGINE "
    "GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE "
    "ACCESS_TYPE_VIRT_WRITE",
    "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid "
    "149",
    "NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to "
    "0x1 (GPU Reset "
    "Required)",
    "NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=77, name=python, Ch 00000010",
    "NVRM: Xid (0000:01:00): 31, Ch 00000001, engmask 00000101",
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 46 egress non-posted PRIV "
    "error (First)",
    "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:2330) installed in this system has fallen off "
    "the bus and is not "
    "responding to commands.",
    "NVRM: GPU at PCI:0000:2b:00: GPU-6a6d5b2e-1f3c-4d5e-8f90-123456789abc",
]
FRAGMENTS = [
    "caused by previous Xid 1 ",
    "recovery action changed from 0x4 (",
    "NVRM: Xid (PCI:0000:2b:00",
    "name=",
    "pid=",
    " ",
    "\t",
    ",",
    "(",
    "1",
    "NVRM: GPU 0000:2b:00.0 ",
    "fallen off the bus ",
    "0000:00:00:",
    '{"MESSAGE":',
    "[",
    "\\u",
    "\ud800",
    "Xid",
    "SXid (",
    "=",
    "'",
]
EXTREME_NUMBERS = [
    "18446744073709551616",
    "99999999999999999999",
    "4294967296",
    "-1",
    "0",
    "1e303",
    "9" * 400,
    "0x" + "f" * 40,
    "１２３",
    "9999",
    "00000000000000000000000001",
    "2147483648",
    "nan",
]
NUMBER_RE = re.compile(r"\d+")


def kmsg_seeds() -> list[str]:
    lines = [line for line in (DATA / "node-kern.log").read_text().splitlines() if line.strip()]
    return lines + REFERENCE_LINES


def _wrap(rng: random.Random, message: str) -> str | bytes:
    """One transport around a message: bare, /dev/kmsg record, syslog, ISO, dmesg -T, plain dmesg,
    journald.
    """
    choice = rng.randrange(8)
    if choice == 0:
        return message
    if choice == 1:
        return f"{rng.randrange(8)},{rng.randrange(10**6)},{rng.randrange(10**13)},-;{message}"
    if choice == 2:
        return (f"Nov {rng.randrange(1, 31)} 11:55:41 gpu-node-07 kernel: [ "
                f"{rng.random() * 1e5:.6f}] {message}")
    if choice == 3:
        year = rng.choice(["2026", "9999", "0001", "1969", "2262", "2263"])
        return f"{year}-11-30T12:00:00.123456+00:00 gpu-node-07 kernel: {message}"
    if choice == 4:
        return f"[Mon Nov 30 12:00:00 {rng.choice(['2026', '9999', '1970'])}] {message}"
    if choice == 5:
        return f"[{rng.random() * 1e6:12.6f}] {message}"
    record: dict[str, Any] = {
        "MESSAGE": message,
        "_HOSTNAME": "gpu-node-07",
        "__REALTIME_TIMESTAMP": rng.choice(["1796000000000000", "9" * 30, "-5", "abc", 12]),
    }
    if choice == 6 and rng.random() < 0.5:
        record["MESSAGE"] = [
            rng.choice([ord(c) if ord(c) < 256 else 63 for c in message[:200]] + [300, -1, 255])
            for _ in range(min(len(message), 200))
        ]
    text = json.dumps(record, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.1:
        text = text.replace('"MESSAGE"', '"MESSAGE": ' + "[" * 3000 + "]" * 3000 + ', "X"', 1)
    return text


def _mutate_text(rng: random.Random, text: str) -> str:
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(text) + 1)
        if op == 0:  # an extreme number in place of one
            numbers = list(NUMBER_RE.finditer(text))
            if numbers:
                match = rng.choice(numbers)
                text = text[:match.start()] + rng.choice(EXTREME_NUMBERS) + text[match.end():]
        elif op == 1:  # padding (the backtracking shapes), up to the 64 KB limit
            filler = rng.choice([" ", "\t", " \t", ",", "1", "(", "a", "x "])
            size = rng.choice([10, 100, 1000, 8000, 30000, MAX_LINE - len(text) - 10])
            text = text[:pos] + filler * max(1, size // len(filler)) + text[pos:]
        elif op == 2:  # a fragment repeated
            fragment = rng.choice(FRAGMENTS)
            count = rng.choice([2, 10, 100, 1000, (MAX_LINE - len(text)) // max(len(fragment), 1)])
            text = text[:pos] + fragment * max(count, 1) + text[pos:]
        elif op == 3:  # odd characters
            text = (
                text[:pos]
                + "".join(
                    rng.choice(["\ud800", "\udfff", "\x00", "\u2028", "…", "\ufffd", "\x85", "é"])
                    for _ in range(rng.randrange(1, 5))
                )
                + text[pos:]
            )
        elif op == 4:  # cut
            text = text[:pos]
        elif op == 5:  # splice with another seed-like line
            text = text[:pos] + rng.choice(REFERENCE_LINES)[rng.randrange(40):]
        else:  # delete a span
            end = min(len(text), pos + rng.randrange(1, 20))
            text = text[:pos] + text[end:]
    return text[: MAX_LINE + 64]


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buffer = bytearray(data)
    for _ in range(rng.randrange(1, 9)):
        op = rng.randrange(3)
        pos = rng.randrange(len(buffer) + 1)
        if op == 0 and buffer:
            buffer[min(pos, len(buffer) - 1)] = rng.randrange(256)
        elif op == 1:
            buffer[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
        elif buffer:
            del buffer[pos:pos + rng.randrange(1, 6)]
    return bytes(buffer)


def kmsg_inputs(count: int, seed: int) -> Iterator[str | bytes]:
    rng = random.Random(seed)
    seeds = kmsg_seeds()
    for _ in range(count):
        line = rng.choice(seeds)
        message = line.split("] ", 1)[-1] if rng.random() < 0.5 else line
        if rng.random() < 0.7:
            message = _mutate_text(rng, message)
        wrapped = _wrap(rng, message) if rng.random() < 0.6 else message
        if rng.random() < 0.25:
            encoded = (
                wrapped if isinstance(wrapped, bytes) else wrapped.encode("utf-8", "surrogatepass")
            )
            yield _mutate_bytes(rng, encoded)
        else:
            yield wrapped


def dcgm_seeds() -> list[str]:
    lines = []
    for path in sorted(DATA.glob("dcgm-exporter-*.prom")):
        lines.extend(line for line in path.read_text().splitlines() if line.strip())
    return lines


DCGM_VALUES = [
    "3e9",
    "-1e303",
    "1e308",
    "-1e308",
    "+Inf",
    "-Inf",
    "NaN",
    "-0",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "1" + "0" * 30,
    "2147483648",
    "1e-320",
    "0x10",
    "4.2",
    "-5",
    "1",
]


def _mutate_sample(rng: random.Random, line: str) -> str:
    if line.startswith("#"):
        return line if rng.random() < 0.8 else _mutate_text(rng, line)
    op = rng.randrange(8)
    if op == 0:  # an extreme value
        head = line.rsplit(" ", 1)[0]
        return f"{head} {rng.choice(DCGM_VALUES)}"
    if op == 1:  # an extreme timestamp
        return f"{line} {rng.choice(['253402300799000', '-1', '1' * 25, '1796000000000'])}"
    if op == 2:  # a label value
        return re.sub(
            r'gpu="\d+"',
            f'gpu="{rng.choice(["99999999999999", "-1", "x", "１", "0" * 50])}"',
            line,
            count=1,
        )
    if op == 3:  # a long label value
        return line.replace(
            'modelName="', 'modelName="' + "A" * rng.choice([100, 10_000, 60_000]), 1
        )
    if op == 4:  # an odd label
        return line.replace("{", '{err_code="' + rng.choice(["abc", "9" * 30, "48", ""]) + '",', 1)
    if op == 5:
        return _mutate_text(rng, line)
    if op == 6:
        return _mutate_bytes(rng, line.encode()).decode("utf-8", "replace")
    return line


def dcgm_inputs(count: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    seeds = dcgm_seeds()
    for n in range(count):
        if n % 1000 == 0:  # a whole scrape, some lines mutated
            lines = [(_mutate_sample(rng, line) if rng.random() < 0.05 else line) for line in seeds]
        else:
            start = rng.randrange(len(seeds))
            lines = [
                _mutate_sample(rng, line) for line in seeds[start : start + rng.randrange(1, 12)]
            ]
            if rng.random() < 0.002:  # a scrape of many GPUs' worth of lines (up to ~4 MB)
                lines = lines * max(
                    1, min(500, 4_000_000 // max(1, sum(len(line) for line in lines)))
                )
        yield "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")


def _internal(reason: str) -> bool:
    """A kernel-log bad-line reason that is an exception the parser contained (a parser bug), not a
    stated reason.
    """
    return bool(re.match(r"^[A-Z]\w*(Error|Exception): ", reason))


def _dcgm_internal(reason: str) -> bool:
    """A dcgm bad-sample reason that is an exception contained while using a parsed sample (a parser
    bug); the text parser's own refusals of a line ("ValueError: ...", first) are bad lines, not
    bugs."""
    return bool(re.match(r"^[A-Za-z_:][\w:]*: [A-Z]\w*(Error|Exception): ", reason))


def _measure(inputs: Iterator[Any], run: Callable[[Any], tuple[int, int]],
             retime: Callable[[Any], None] | None) -> dict[str, Any]:
    """Run every input; the slowest ones (by time and by time per KB) are timed again, best of 3, on
    a fresh parser, so that a pause of a loaded machine is not reported as the parser's worst case.
    """
    count = crashes = refused = 0
    largest = total_bytes = 0
    first_crash = None
    slowest: list[tuple[float, int, Any]] = []  # (ms, bytes, input): the 20 slowest
    slowest_per_kb: list[tuple[float, int, Any]] = []
    started = time.perf_counter()
    for item in inputs:
        size = len(item)
        count += 1
        total_bytes += size
        largest = max(largest, size)
        t0 = time.perf_counter()
        try:
            refused += run(item)[1]
        except Exception:
            crashes += 1
            first_crash = first_crash or traceback.format_exc(limit=3)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        slowest.append((elapsed_ms, size, item))
        if size >= 1024:
            slowest_per_kb.append((elapsed_ms / (size / 1024), size, item))
        if count % 10_000 == 0:  # progress (stderr): what a run cut short has shown so far
            print(
                json.dumps(
                    {
                        "progress": count,
                        "crashes": crashes,
                        "rows_refused_by_batch": refused,
                        "seconds": round(time.perf_counter() - started, 1),
                        "peak_rss_mb": round(peak_rss_mb(), 1),
                    }
                ),
                file=sys.stderr,
                flush=True,
            )
        if len(slowest) > 200:
            slowest = sorted(slowest, key=lambda entry: entry[0], reverse=True)[:20]
        if len(slowest_per_kb) > 200:
            slowest_per_kb = sorted(slowest_per_kb, key=lambda entry: entry[0], reverse=True)[:20]
    seconds = time.perf_counter() - started

    def best_of_3(item: Any) -> float:
        if retime is None:  # (the CI's seed set: no timing)
            return 0.0
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            retime(item)
            times.append((time.perf_counter() - t0) * 1000)
        return min(times)

    worst = max(
        (
            (best_of_3(item), size, item)
            for _, size, item in sorted(slowest, key=lambda e: e[0], reverse=True)[:20]
        ),
        default=(0.0, 0, ""),
        key=lambda entry: entry[0],
    )
    worst_kb = max(((best_of_3(item) / (size / 1024), size, item) for _, size, item in
                    sorted(slowest_per_kb, key=lambda e: e[0], reverse=True)[:20]),
                   default=(0.0, 0, ""), key=lambda entry: entry[0])
    return {
        "inputs": count,
        "crashes": crashes,
        "tracebacks": crashes,
        "rows_refused_by_batch": refused,
        "worst_input_ms": round(worst[0], 3),
        "worst_input": f"{worst[1]} bytes: {worst[2][:60]!r}",
        "worst_ms_per_kb": round(worst_kb[0], 4),
        "worst_per_kb_input": f"{worst_kb[1]} bytes: {worst_kb[2][:60]!r}",
        "largest_input_bytes": largest,
        "total_mb": round(total_bytes / 1e6, 1),
        "seconds": round(seconds, 1),
        "first_crash": first_crash,
    }


def fuzz_kmsg(count: int, seed: int, *, timing: bool = True) -> dict[str, Any]:
    state = {"parser": KernelLogParser(), "fed": 0, "internal": 0, "bad": 0}

    def run(item: str | bytes) -> tuple[int, int]:
        parser = state["parser"]
        # a fresh stream now and then (the parser keeps multi-line state)
        if state["fed"] % 1000 == 999:
            state["bad"] += parser.stats.bad_lines
            state["internal"] += sum(_internal(reason) for _, reason in parser.stats.bad_examples)
            parser = state["parser"] = KernelLogParser()
        state["fed"] += 1
        before = len(parser.stats.bad_examples)
        events = parser.feed(item, state["fed"])
        if len(parser.stats.bad_examples) > before:
            state["internal"] += _internal(parser.stats.bad_examples[-1][1])
            parser.stats.bad_examples.clear()
        rows = events_to_rows(events, IDENTITY, default_ts_ns=1_796_000_000 * 10**9)
        _, rejected = guarded_batch("gpu_events", rows)
        return len(rows), len(rejected)

    def retime(item: str | bytes) -> None:
        events = KernelLogParser().feed(item, 1)
        guarded_batch(
            "gpu_events", events_to_rows(events, IDENTITY, default_ts_ns=1_796_000_000 * 10**9)
        )

    result = _measure(kmsg_inputs(count, seed), run, retime if timing else None)
    result["bad_lines"] = state["bad"] + state["parser"].stats.bad_lines
    result["internal_errors_contained"] = state["internal"]
    return result


def fuzz_dcgm(count: int, seed: int, *, timing: bool = True) -> dict[str, Any]:
    state = {"parser": DcgmParser(), "n": 0, "bad": 0, "internal": 0}

    def run(text: str) -> tuple[int, int]:
        if state["n"] % 100 == 99:
            state["bad"] += state["parser"].stats.bad_lines
            state["parser"] = DcgmParser()
        state["n"] += 1
        parser = state["parser"]
        before = len(parser.stats.bad_examples)
        samples, events = parser.parse(
            text, IDENTITY, ts_ns=1_796_000_000 * 10**9, monotonic=float(state["n"])
        )
        state["internal"] += sum(
            _dcgm_internal(reason) for _, reason in parser.stats.bad_examples[before:]
        )
        del parser.stats.bad_examples[:]
        refused = 0
        for table, rows in (("gpu_samples", samples), ("gpu_events", events)):
            refused += len(guarded_batch(table, rows)[1])
        return len(samples) + len(events), refused

    def retime(text: str) -> None:
        samples, events = DcgmParser().parse(text, IDENTITY, ts_ns=1_796_000_000 * 10**9)
        guarded_batch("gpu_samples", samples)
        guarded_batch("gpu_events", events)

    result = _measure(dcgm_inputs(count, seed), run, retime if timing else None)
    result["bad_lines"] = state["bad"] + state["parser"].stats.bad_lines
    result["internal_errors_contained"] = state["internal"]
    return result


def real_input_ms_per_kb() -> dict[str, float]:
    """The same parsers on the real files, for scale: ms per KB (best of 5)."""
    log = (DATA / "node-kern.log").read_bytes().splitlines()
    scrape = (DATA / "dcgm-exporter-new-names.prom").read_text()

    def best(fn: Callable[[], Any]) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1000

    kmsg_ms = best(lambda: KernelLogParser().feed_lines(log))
    dcgm_ms = best(lambda: DcgmParser().parse(scrape, IDENTITY))
    return {"kmsg_real_log_ms_per_kb": round(kmsg_ms / (sum(map(len, log)) / 1024), 4),
            "dcgm_real_scrape_ms_per_kb": round(dcgm_ms / (len(scrape) / 1024), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kmsg", type=int, default=100_000, help="kernel-log inputs")
    parser.add_argument("--dcgm", type=int, default=100_000, help="dcgm scrape inputs")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--only", choices=("kmsg", "dcgm"), help="fuzz one parser only")
    args = parser.parse_args(argv)
    if args.only:
        result = (
            fuzz_kmsg(args.kmsg, args.seed)
            if args.only == "kmsg"
            else fuzz_dcgm(args.dcgm, args.seed)
        )
        emit(
            f"parse_fuzz_{args.only}",
            {
                "seed": args.seed,
                **result,
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "machine": machine(),
            },
        )
        return
    rss_start = peak_rss_mb()
    kmsg = fuzz_kmsg(args.kmsg, args.seed)
    rss_kmsg = peak_rss_mb()
    dcgm = fuzz_dcgm(args.dcgm, args.seed)
    emit(
        "parse_fuzz",
        {
            "seed": args.seed,
            "kmsg": kmsg,
            "dcgm": dcgm,
            "real_inputs": real_input_ms_per_kb(),
            "rss_after_imports_mb": round(rss_start, 1),
            "peak_rss_after_kmsg_mb": round(rss_kmsg, 1),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "largest_real_input_bytes": max(path.stat().st_size for path in DATA.glob("*")),
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
