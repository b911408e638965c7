"""Run every benchmark of the project, one after the other, and write docs/benchmarks.md.

    python -m bench.run_all [--quick] [--only sink,query,...] [--out docs/benchmarks.md]

Each benchmark runs in its own process (so its peak memory is its own) and prints its result as JSON; the runner
keeps the raw results in bench/out/results.json and renders one section per benchmark: what was compared, the
headline figures and ratios, the command that reproduces it, and the raw result. --quick uses small sizes (for a
smoke run); the published file is made without it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import machine

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


@dataclass(frozen=True)
class Benchmark:
    key: str
    title: str
    compares: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    headline: Callable[[dict[str, Any]], list[str]] = field(default=lambda r: [])
    timeout_s: float = 1800.0

    def command(self, quick: bool) -> list[str]:
        return [sys.executable, *(self.quick if quick else self.full)]


def _get(result: dict[str, Any], *path: str, default: Any = None) -> Any:
    value: Any = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return default
        value = value[key]
    return value


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _sink(r: dict[str, Any]) -> list[str]:
    lines = []
    for run in r["runs"]:
        lines.append(f"{run['nodes']} node(s): faultlens sink **{_fmt(run['sink_rows_per_s'])} rows/s** "
                     f"({_fmt(run['sink_rows_per_cpu_s'])} per CPU-second, {run['sink_segments']} crash-safe segments)"
                     f" vs pandas `to_parquet` per batch {_fmt(run['pandas_rows_per_s'])} rows/s (one plain file per "
                     f"batch, no partitioning, no atomic visibility): **{run['ratio_sink_over_pandas']}x**")
    lines.append("target: >= 1,000,000 rows/s per core")
    return lines


def _query(r: dict[str, Any]) -> list[str]:
    duck, pand = r.get("duckdb", {}), r.get("pandas", {})
    lines = [f"{_fmt(r['rows'])} step rows, {r['ranks']} ranks, 1 thread each side"]
    if "q1_s" in pand:
        lines.append(f"Q1 per-rank profile: DuckDB {_fmt(duck['q1_s'])} s vs pandas {_fmt(pand['q1_s'])} s "
                     f"(**{r.get('ratio_q1')}x**); Q2 slowest nodes: DuckDB {_fmt(duck['q2_s'])} s vs pandas "
                     f"{_fmt(pand['q2_s'])} s (**{r.get('ratio_q2')}x**); same answers: {r.get('same_answer')}")
        lines.append(f"peak RSS: DuckDB {_fmt(duck.get('peak_rss_mb'))} MB, pandas {_fmt(pand.get('peak_rss_mb'))} MB")
    else:
        lines.append(f"DuckDB Q1 {_fmt(duck.get('q1_s'))} s, Q2 {_fmt(duck.get('q2_s'))} s; pandas failed: "
                     f"{pand.get('error')}")
    return lines


def _timer(r: dict[str, Any]) -> list[str]:
    return [f"faultlens: **{r['faultlens_us_per_section']} µs per section** vs hand-written contextmanager + pandas "
            f"{r['naive_contextmanager_pandas_us_per_section']} µs (**{r['speedup_vs_naive']}x**); target <= "
            f"{r['target_us_per_section']} µs: {'met' if r['meets_target'] else 'NOT met'}",
            f"writer thread (off the training thread): {r['writer_thread_us_per_step_row']} µs per step row"]


def _gpu(r: dict[str, Any]) -> list[str]:
    sampling, klog = r["sampling"], r["kernel_log"]
    ratio = sampling["us_per_gpu_sample_naive_table_per_row"] / sampling["us_per_gpu_sample_poll"]
    return [f"NVML source through the recorded backend: **{sampling['us_per_gpu_sample_poll']} µs per GPU sample** "
            f"(~{_fmt(sampling['gpus_per_second_at_1s_interval_one_core'])} GPUs per core at 1 s) vs one Arrow table "
            f"per sample {sampling['us_per_gpu_sample_naive_table_per_row']} µs (**{ratio:.1f}x**)",
            f"kernel log, 1% GPU lines: **{_fmt(klog['1pct_gpu_lines']['faultlens_lines_per_s'])} lines/s** vs one "
            f"regex per line {_fmt(klog['1pct_gpu_lines']['naive_regex_lines_per_s'])} lines/s (the regex misses "
            "the old-driver, MIG, SXid and fallen-off-the-bus forms and reads no timestamps)",
            f"kernel log, every line a GPU line: {_fmt(klog['all_gpu_lines']['faultlens_lines_per_s'])} lines/s vs "
            f"{_fmt(klog['all_gpu_lines']['naive_regex_lines_per_s'])}"]


def _live_lag(r: dict[str, Any]) -> list[str]:
    follow, batch = r["follow"], r["batch_rerun_back_to_back"]
    return [f"`attribute --follow`: **p50 {follow['p50_s']} s, p95 {follow['p95_s']} s** from a segment landing to "
            f"its incident row ({follow['found']}/{follow['runs']} found, store of {_fmt(r['store']['step_rows'])} "
            f"step rows while {follow['while_streaming_step_rows_per_s']} rows/s stream in); target <= "
            f"{r['target_s']} s",
            f"re-running the batch pass back to back: p50 {batch['p50_s']} s, p95 {batch['p95_s']} s "
            f"(**{batch['p50_s'] / follow['p50_s']:.1f}x** slower at p50)"]


def _restore(r: dict[str, Any]) -> list[str]:
    res = r["results"]
    return [f"lazy choice **{res['faultlens_lazy']['median_s']} s** vs verifying every checkpoint first "
            f"{res['eager_verify_all']['median_s']} s (**{r['speedup']}x**), same step chosen "
            f"({res['faultlens_lazy']['chosen_step']}); {r['steps']} steps x {r['ranks']} ranks x {r['shard_kib']} KiB"]


def _delivery(r: dict[str, Any]) -> list[str]:
    res = r["results"]
    a, b = res["faultlens_persist_then_deliver"], res["post_without_persisting"]
    return [f"persist, then deliver to a webhook: **p50 {a['p50_ms']} ms, p95 {a['p95_ms']} ms** vs a bare POST "
            f"p50 {b['p50_ms']} ms (the difference is the price of never losing a decision)"]


def _eval(r: dict[str, Any]) -> list[str]:
    m, c = r["measured"], r["corpus"]
    return [f"corpus: {c['nodes']} nodes x {c['gpus_per_node']} GPUs x {c['hours']:.0f} h, seed {c['seed']}, "
            f"{c['faults']} faults at the Llama 3 mix (+ stragglers, benign noise)",
            f"culprit-node F1 **{m['culprit_node_f1']}** (target >= 0.99; Minder reports 0.893); software bugs "
            f"failed over: **{m['software_failovers']}** (target 0); handled without a human: "
            f"**{m['handled_without_human']}** (target >= 0.90)",
            f"median detection latency (simulated time, replayed live): crash **{m['crash_latency_median_s']} s** "
            f"(target <= 2), hang after progress stops **{m['hang_latency_after_progress_stops_median_s']:.0f} s** "
            "(target <= 15)",
            "per class F1: " + ", ".join(f"{k} {v['f1']}" for k, v in r.get("per_class", {}).items())]


def _hang(r: dict[str, Any]) -> list[str]:
    lines = []
    for row in r.get("sizes", []):
        fl, torch = row.get("faultlens", {}), row.get("torch", {})
        line = (f"{_fmt(row['ranks'])} ranks x {r.get('entries_per_rank')} entries ({_fmt(row.get('dump_mb'))} MB of "
                f"dumps): faultlens **{_fmt(fl.get('seconds'))} s** wall ({_fmt(fl.get('cpu_seconds'))} s CPU), peak "
                f"RSS {_fmt(fl.get('peak_rss_mb'))} MB, culprit found: {fl.get('correct')}")
        if "seconds" in torch:
            line += (f"; torch fr_trace {_fmt(torch.get('seconds'))} s, RSS {_fmt(torch.get('peak_rss_mb'))} MB: "
                     f"**{row.get('speedup_vs_torch')}x** wall, {row.get('cpu_speedup_vs_torch')}x CPU")
        elif torch.get("skipped"):
            line += f"; torch: skipped ({torch['skipped']})"
        lines.append(line)
    ingest = r.get("ingest")
    if isinstance(ingest, dict):
        lines.append("ingest into the collectives table: " + ", ".join(
            f"{k} {_fmt(v)}" for k, v in ingest.items() if isinstance(v, (int, float))))
    load = r.get("load_average_at_start")
    lines.append("targets: 16,384 ranks in <= 30 s and <= 8 GB RSS; >= 30x torch at 1,024 ranks"
                 + (f" (machine load average at start {load[0]:.1f}; under a load of ~9 the same 16,384-rank run "
                    "took 47.7 s)" if load else ""))
    return lines


def _vs(r: dict[str, Any]) -> list[str]:
    f, t, ratios = r["faultlens"], r["torchrun"], r["ratios"]
    bug = r.get("torchrun_software_bug_alone", {})
    return [f"faultlens: stopped after {f['wall_s']} s by {f['ended_by']}, {f['restarts']} restarts, "
            f"{f['kept_steps']} kept / {f['lost_steps']} lost steps, ETTR {f['ettr']}, "
            f"{f['kept_steps_per_min']} kept steps/min, software bug restarted **{f['software_bug_restarts']}** times",
            f"plain torchrun --max-restarts {r['max_restarts']}: stopped after {t['wall_s']} s by {t['ended_by']}, "
            f"{t['restarts']} restarts on the same nodes, {t['kept_steps']} kept / {t['lost_steps']} lost steps, "
            f"ETTR {t['ettr']}, {t['kept_steps_per_min']} kept steps/min; the software bug alone: restarted "
            f"**{bug.get('software_bug_restarts', '?')}** times, {bug.get('software_bug_to_stop_s', '?')} s to stop",
            "ratios faultlens/torchrun: " + ", ".join(f"{k} {v}" for k, v in ratios.items()
                                                      if not isinstance(v, dict)),
            "ETTR here counts kept steps at their measured duration, so the plain run's straggler-slowed steps count "
            "as productive; goodput at the healthy step time and kept steps per minute show the straggler's cost. "
            "faultlens resumes from older checkpoints because excluding a node drops its local tier (the demo has "
            "no peer tier; durable every 10 steps)"]



def _attribute_scale(r: dict[str, Any]) -> list[str]:
    runs = r.get("results", [r])
    lines = [f"{run['nodes']} nodes x {run['gpus_per_node']} GPUs x {run['hours']:g} h ({_fmt(run['rows']['steps'])} "
             f"step rows): `faultlens attribute` **{_fmt(run['attribute']['cpu_s'])} s CPU** "
             f"({_fmt(run['attribute']['wall_s'])} s wall), peak RSS **{_fmt(run['attribute']['peak_rss_mb'])} MB**, "
             f"{run['incidents']} incidents" for run in runs]
    lines.append("target: peak RSS <= 1,536 MB at every size, time linear in the step rows; the same incidents as "
                 "the engine before (`--tree DIR --label before`, then `--compare <out>/before.json`)")
    return lines


def _follow_listing(r: dict[str, Any]) -> list[str]:
    return [f"{run['scenario']} ({_fmt(run['nodes'])} nodes, {_fmt(run['segments_in_store'])} segments): list "
            f"requests per poll **{run['after']['list_requests'][-1]}** (job partitions, window dates) vs "
            f"{run['before']['list_requests'][-1]} (every table whole); segments handed to the tail "
            f"{_fmt(run['after']['segments_listed'])} vs {_fmt(run['before']['segments_listed'])}"
            for run in r["runs"]]

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("sink", "Store ingest: step rows into Parquet", "faultlens SegmentSink vs pandas DataFrame.to_parquet "
              "per batch", ("-m", "bench.bench_sink", "--rows", "2000000"),
              ("-m", "bench.bench_sink", "--rows", "200000"), _sink),
    Benchmark("query", "Queries over the steps table", "DuckDB views over the Parquet layout vs pandas "
              "(read_parquet of the needed columns)", ("-m", "bench.bench_query", "--rows", "100000000"),
              ("-m", "bench.bench_query", "--rows", "2000000", "--ranks", "64"), _query, 3600.0),
    Benchmark("timer", "Step timer overhead on the training thread", "faultlens StepTimer vs a contextmanager + "
              "list of dicts + pandas", ("-m", "bench.bench_timer"),
              ("-m", "bench.bench_timer", "--steps", "2000", "--repeat", "2"), _timer),
    Benchmark("gpu", "GPU collector costs", "NVML source sample per GPU and kernel-log parsing vs naive shapes",
              ("bench/bench_gpu.py",), ("bench/bench_gpu.py", "--quick"), _gpu),
    Benchmark("hang", "Hang analysis at scale", "faultlens analyze-hang vs torch's flight-recorder analyzer on the "
              "same dumps", ("-m", "bench.bench_hang", "--ranks", "1024,4096,16384"),
              ("-m", "bench.bench_hang", "--ranks", "64"), _hang, timeout_s=5400.0),
    Benchmark("live_lag", "Live lag: segment landing -> incident row", "attribute --follow vs re-running the batch "
              "pass", ("bench/bench_live_lag.py",), ("bench/bench_live_lag.py", "--runs", "3", "--ranks", "64"),
              _live_lag),
    Benchmark("restore", "Restore choice", "lazy verification vs verifying every checkpoint first",
              ("bench/bench_restore_choice.py",), ("bench/bench_restore_choice.py", "--steps", "4", "--ranks", "8"),
              _restore),
    Benchmark("delivery", "Decision delivery", "persist-then-deliver (at least once) vs a bare POST",
              ("bench/bench_decision_delivery.py",), ("bench/bench_decision_delivery.py", "--decisions", "20"),
              _delivery),
    Benchmark("eval", "Attribution accuracy on the simulated cluster", "faultlens eval on faultlens simulate",
              ("-m", "bench.bench_eval", "--seed", "1", "--replay"),
              ("-m", "bench.bench_eval", "--nodes", "4", "--hours", "4"), _eval),
    Benchmark("demo_vs_torchrun", "The demo's faults: faultlens vs plain torchrun --max-restarts 3",
              "ETTR, lost steps, restarts of the software bug", ("-m", "bench.bench_demo_vs_torchrun"),
              ("-m", "bench.bench_demo_vs_torchrun", "--no-bug-run"), _vs),
    Benchmark("attribute_scale", "Attribution at scale: the batch pass in bounded memory", "`faultlens attribute` "
              "over simulated 16, 64 and 256 nodes x 8 GPUs x 24 h (the engine before: the same command with --tree)",
              ("-m", "bench.bench_attribute_scale", "--nodes", "16", "64", "256"),
              ("-m", "bench.bench_attribute_scale", "--nodes", "4", "--hours", "4", "--label", "quick"),
              _attribute_scale, timeout_s=5400.0),
    Benchmark("follow_listing", "Follower listing per poll", "the job's partitions from the window's dates vs "
              "every tailed table listed whole, on moto's S3 server", ("-m", "bench.bench_follow_listing"),
              ("-m", "bench.bench_follow_listing", "--nodes", "64", "--days", "3", "--polls", "1"),
              _follow_listing, timeout_s=3600.0),
)


def run_one(bench: Benchmark, quick: bool) -> dict[str, Any]:
    command = bench.command(quick)
    if not (ROOT / command[1]).exists() and command[1] == "-m" and not (
            ROOT / (command[2].replace(".", "/") + ".py")).exists():
        return {"error": f"{command[2]} is not in this checkout"}
    if command[1] != "-m" and not (ROOT / command[1]).exists():
        return {"error": f"{command[1]} is not in this checkout"}
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=bench.timeout_s,
                              env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {bench.timeout_s:.0f} s"}
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail), "seconds": seconds}
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"benchmark"')]
    if not results:
        try:
            results = [json.loads(proc.stdout)]
        except json.JSONDecodeError:
            start = proc.stdout.find("{")
            results = [json.loads(proc.stdout[start:])] if start >= 0 else []
    if not results:
        return {"error": "no JSON result printed", "seconds": seconds}
    result = results[0] if len(results) == 1 else {"results": results}
    result["_seconds"] = round(seconds, 1)
    return result


def render(results: dict[str, dict[str, Any]], quick: bool, argv: list[str]) -> str:
    info = machine()
    lines = [
        "# Benchmarks",
        "",
        f"Made by `{' '.join(['python -m bench.run_all', *argv])}` on {dt.date.today().isoformat()}, "
        f"{info['cpu']}, {info['cores']} cores, Python {info['python']} (no GPU). Raw results are kept in "
        "bench/out/results.json; `python -m bench.run_all --only KEY --merge` reruns one benchmark and keeps the rest.",
        "Each benchmark ran in its own process, one after the other, each side of a comparison in the same run. "
        "Speed targets are measured here, never asserted in tests. Rerun one with the command under its heading.",
        "",
    ]
    if quick:
        lines += ["**Smoke run (--quick): small sizes, not the published figures.**", ""]
    for bench in BENCHMARKS:
        result = results.get(bench.key)
        if result is None:
            continue
        lines += [f"## {bench.title}", "", f"Compares: {bench.compares}.", "",
                  f"    PYTHONPATH=. python {' '.join(bench.quick if quick else bench.full)}", ""]
        if "error" in result:
            lines += [f"Not measured: {result['error']}", ""]
            continue
        try:
            headline = bench.headline(result)
        except (KeyError, TypeError, ValueError):
            headline = []
        lines += [f"- {line}" for line in headline]
        if headline:
            lines.append("")
        raw = {k: v for k, v in result.items() if k not in ("machine",)}
        lines += ["<details><summary>raw result</summary>", "", "```json", json.dumps(raw, indent=1, default=str),
                  "```", "", "</details>", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="run every benchmark and write docs/benchmarks.md")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", help="comma-separated keys: " + ",".join(b.key for b in BENCHMARKS))
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--merge", action="store_true", help="keep earlier results of benchmarks not run now")
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else {b.key for b in BENCHMARKS}
    OUT.mkdir(parents=True, exist_ok=True)
    store = OUT / ("results-quick.json" if args.quick else "results.json")
    results: dict[str, dict[str, Any]] = json.loads(store.read_text()) if args.merge and store.exists() else {}
    for bench in BENCHMARKS:
        if bench.key not in wanted:
            continue
        print(f"running {bench.key} ...", file=sys.stderr, flush=True)
        results[bench.key] = run_one(bench, args.quick)
        print(f"  {bench.key}: {'error: ' + results[bench.key]['error'] if 'error' in results[bench.key] else 'ok'}",
              file=sys.stderr, flush=True)
        store.write_text(json.dumps(results, indent=1, default=str))
    Path(args.out).write_text(render(results, args.quick, sys.argv[1:]))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
