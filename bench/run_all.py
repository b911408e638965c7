"""Run every benchmark of the project, one after the other, and publish their results in
docs/benchmarks.md.

    python -m bench.run_all [--quick] [--only sink,query,...] [--merge] [--out docs/benchmarks.md]

Each benchmark runs in its own process (so its peak memory is its own) and prints its result as
JSON; the runner keeps the raw results in bench/out/results.json and writes one section per
benchmark run: what was compared, the command that reproduces it, and its table of figures (value,
target, the anchor measured in the same run, the ratio, the commit, the date), in the one form of
bench/common.py `render_section`. The sections of benchmarks not run now stay as they are. --quick
uses small sizes (a smoke run) and writes a fresh file, by default bench/out/benchmarks-quick.md,
never the published one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.common import (
    DOC_HEADER,
    NONE,
    Figure,
    Section,
    render_document,
    write_section,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PUBLISHED = ROOT / "docs" / "benchmarks.md"

Figures = Callable[[dict[str, Any]], list[Figure]]


@dataclass(frozen=True)
class Benchmark:
    key: str
    title: str
    compares: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    figures: Figures
    timeout_s: float = 1800.0
    notes: tuple[str, ...] = ()  # what every run's figures mean (the run's conditions are added)

    def command(self, quick: bool) -> list[str]:
        return [sys.executable, *(self.quick if quick else self.full)]


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _x(value: Any) -> str:
    """A ratio the benchmark computed, as it printed it."""
    return NONE if value is None else f"{value}x"


def _over(a: Any, b: Any) -> str:
    """a / b as a ratio cell (two significant digits below 1), `-` where either is missing or b
    is zero."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
        return NONE
    ratio = a / b
    return f"{ratio:.2g}x" if ratio < 1 else f"{ratio:.1f}x"


def _yes(flag: Any) -> str:
    return {True: "yes", False: "no"}.get(flag, NONE)


def _sink(r: dict[str, Any]) -> list[Figure]:
    target = ">= 1,000,000 rows/s per core"
    figures = []
    for run in r["runs"]:
        nodes = f"{run['nodes']} node{'' if run['nodes'] == 1 else 's'}"
        where = f"{nodes} per flush, {run['sink_segments']} crash-safe segments"
        figures += [
            Figure(f"{where}: rows/s", f"{_fmt(run['sink_rows_per_s'])} rows/s", target,
                   f"pandas to_parquet per batch {_fmt(run['pandas_rows_per_s'])} rows/s",
                   _x(run["ratio_sink_over_pandas"])),
            Figure(f"{where}: rows per CPU-second", f"{_fmt(run['sink_rows_per_cpu_s'])} rows",
                   target, f"pandas {_fmt(run['pandas_rows_per_cpu_s'])} rows",
                   _over(run["sink_rows_per_cpu_s"], run["pandas_rows_per_cpu_s"]))]
    return figures


def _query(r: dict[str, Any]) -> list[Figure]:
    duck, pand = r.get("duckdb", {}), r.get("pandas", {})
    size = f"{_fmt(r['rows'])} step rows, {r['ranks']} ranks, 1 thread each side"
    if "q1_s" not in pand:
        return [Figure(f"Q1 per-rank profile ({size})", f"{_fmt(duck.get('q1_s'))} s",
                       anchor=f"pandas failed: {pand.get('error')}")]
    return [
        Figure(f"Q1 per-rank profile ({size})", f"{_fmt(duck['q1_s'])} s",
               anchor=f"pandas {_fmt(pand['q1_s'])} s", ratio=_x(r.get("ratio_q1"))),
        Figure("Q2 slowest nodes", f"{_fmt(duck['q2_s'])} s",
               anchor=f"pandas {_fmt(pand['q2_s'])} s", ratio=_x(r.get("ratio_q2"))),
        Figure("peak RSS", f"{_fmt(duck.get('peak_rss_mb'))} MB",
               anchor=f"pandas {_fmt(pand.get('peak_rss_mb'))} MB",
               ratio=_over(pand.get("peak_rss_mb"), duck.get("peak_rss_mb"))),
        Figure("same answers", _yes(r.get("same_answer")), "yes")]


def _timer(r: dict[str, Any]) -> list[Figure]:
    return [
        Figure("time per section on the training thread", f"{r['faultlens_us_per_section']} µs",
               f"<= {r['target_us_per_section']} µs",
               f"contextmanager + list of dicts + pandas "
               f"{r['naive_contextmanager_pandas_us_per_section']} µs", _x(r["speedup_vs_naive"])),
        Figure("writer thread per step row (off the training thread)",
               f"{r['writer_thread_us_per_step_row']} µs")]


def _gpu(r: dict[str, Any]) -> list[Figure]:
    sampling, klog = r["sampling"], r["kernel_log"]
    poll = sampling["us_per_gpu_sample_poll"]
    naive = sampling["us_per_gpu_sample_naive_table_per_row"]
    figures = [
        Figure("NVML source through the recorded backend: time per GPU sample", f"{poll} µs",
               anchor=f"one Arrow table per sample {naive} µs", ratio=_over(naive, poll)),
        Figure("GPUs one core samples at a 1 s interval",
               f"{_fmt(sampling['gpus_per_second_at_1s_interval_one_core'])} GPUs")]
    kinds = (("1pct_gpu_lines", "1% GPU lines"), ("all_gpu_lines", "every line a GPU line"))
    for key, label in kinds:
        ours, regex = klog[key]["faultlens_lines_per_s"], klog[key]["naive_regex_lines_per_s"]
        figures.append(Figure(f"kernel log, {label}: lines/s", f"{_fmt(ours)} lines/s",
                              anchor=f"one regex per line {_fmt(regex)} lines/s",
                              ratio=_over(ours, regex)))
    return figures


def _hang(r: dict[str, Any]) -> list[Figure]:
    figures = []
    for row in r.get("sizes", []):
        fl, torch = row.get("faultlens", {}), row.get("torch", {})
        size = (f"{_fmt(row['ranks'])} ranks x {_fmt(r.get('entries_per_rank'))} entries "
                f"({_fmt(row.get('dump_mb'))} MB of dumps)")
        culprit = {True: "culprit right", False: "culprit WRONG"}.get(fl.get("correct"),
                                                                     "culprit ?")
        large = row["ranks"] >= 16384
        if "seconds" in torch:
            anchor = (f"torch fr_trace {_fmt(torch['seconds'])} s "
                      f"({_fmt(torch.get('cpu_seconds'))} s CPU)")
            ratio = f"{_x(row.get('speedup_vs_torch'))} ({_x(row.get('cpu_speedup_vs_torch'))} CPU)"
            memory = (f"torch fr_trace {_fmt(torch.get('peak_rss_mb'))} MB",
                      _over(torch.get("peak_rss_mb"), fl.get("peak_rss_mb")))
        else:
            anchor = f"torch: {torch['skipped']}" if torch.get("skipped") else NONE
            ratio, memory = NONE, (NONE, NONE)
        figures += [
            Figure(f"{size}: read + analysis wall",
                   f"{_fmt(fl.get('seconds'))} s ({_fmt(fl.get('cpu_seconds'))} s CPU), {culprit}",
                   "<= 30 s" if large else (">= 30x torch" if "seconds" in torch else NONE),
                   anchor, ratio),
            Figure(f"{size}: peak RSS", f"{_fmt(fl.get('peak_rss_mb'))} MB",
                   "<= 8 GB" if large else NONE, *memory)]
    ingest = r.get("ingest")
    if isinstance(ingest, dict) and "faultlens_dumps_per_s" in ingest:
        label = f"ingest into the collectives table ({_fmt(ingest.get('ranks'))} ranks)"
        rate = f"{_fmt(ingest['faultlens_dumps_per_s'])} dumps/s"
        figures += [
            Figure(label, rate,
                   anchor=f"pickle.load {_fmt(ingest.get('pickle_load_dumps_per_s'))} dumps/s",
                   ratio=_x(ingest.get("speedup_vs_pickle_load"))),
            Figure(label, rate, anchor=f"restricted unpickler + row dicts "
                                       f"{_fmt(ingest.get('naive_rows_dumps_per_s'))} dumps/s",
                   ratio=_x(ingest.get("speedup_vs_naive")))]
    return figures


def _live_lag(r: dict[str, Any]) -> list[Figure]:
    follow, batch = r["follow"], r["batch_rerun_back_to_back"]
    return [Figure(
        f"`attribute --follow`, segment landing -> its incident row, p50 / p95 (store of "
        f"{_fmt(r['store']['step_rows'])} step rows, "
        f"{follow['while_streaming_step_rows_per_s']} rows/s streaming in)",
        f"{follow['p50_s']} s / {follow['p95_s']} s ({follow['found']}/{follow['runs']} found)",
        f"<= {r['target_s']} s",
        f"the batch pass rerun back to back: {batch['p50_s']} s / {batch['p95_s']} s",
        _over(batch["p50_s"], follow["p50_s"]))]


def _restore(r: dict[str, Any]) -> list[Figure]:
    res = r["results"]
    lazy, eager = res["faultlens_lazy"], res["eager_verify_all"]
    return [Figure(f"choose the checkpoint to restore ({r['steps']} steps x {r['ranks']} ranks x "
                   f"{r['shard_kib']} KiB)", f"{lazy['median_s']} s, step {lazy['chosen_step']}",
                   "the same step as verifying all", f"verify every checkpoint first "
                   f"{eager['median_s']} s, step {eager['chosen_step']}", _x(r["speedup"]))]


def _delivery(r: dict[str, Any]) -> list[Figure]:
    a, b = r["results"]["faultlens_persist_then_deliver"], r["results"]["post_without_persisting"]
    return [Figure(f"persist, then deliver to a webhook, p50 / p95 ({r['decisions']} decisions)",
                   f"{a['p50_ms']} ms / {a['p95_ms']} ms", NONE,
                   f"a bare POST {b['p50_ms']} ms / {b['p95_ms']} ms",
                   _over(b["p50_ms"], a["p50_ms"]))]


def _eval(r: dict[str, Any]) -> list[Figure]:
    m, c, targets = r["measured"], r["corpus"], r.get("targets", {})
    corpus = (f"{c['nodes']} nodes x {c['gpus_per_node']} GPUs x {c['hours']:g} h, "
              f"seed {c['seed']}, {c['faults']} faults")
    figures = [
        Figure(f"culprit-node F1 ({corpus})", str(m["culprit_node_f1"]),
               f"{targets.get('culprit_node_f1', '>= 0.99')} (Minder reports 0.893)"),
        Figure("software bugs failed over", str(m["software_failovers"]),
               targets.get("software_failovers", "0")),
        Figure("handled without a human", str(m["handled_without_human"]),
               targets.get("handled_without_human", ">= 0.90")),
        Figure("detection F1", str(r.get("detection", {}).get("f1", NONE))),
        Figure("median detection latency, crash (simulated time, replayed live)",
               f"{_fmt(m['crash_latency_median_s'])} s",
               f"{targets.get('crash_latency_median_s', '<= 2')} s"),
        Figure("median detection latency, hang after progress stops",
               f"{_fmt(m['hang_latency_after_progress_stops_median_s'])} s",
               f"{targets.get('hang_latency_after_progress_stops_median_s', '<= 15')} s")]
    figures += [Figure(f"F1, {name}", str(v["f1"])) for name, v in r.get("per_class", {}).items()]
    return figures


def _vs(r: dict[str, Any]) -> list[Figure]:
    f, t, ratios = r["faultlens"], r["torchrun"], r["ratios"]
    bug = r.get("torchrun_software_bug_alone", {})
    plain = f"plain torchrun --max-restarts {r['max_restarts']}"
    return [
        Figure("wall to the job's end", f"{f['wall_s']} s, by {f['ended_by']}", NONE,
               f"{plain}: {t['wall_s']} s, by {t['ended_by']}",
               _x(ratios.get("wall_torchrun_over_faultlens"))),
        Figure("restarts", str(f["restarts"]), NONE, f"{t['restarts']} on the same nodes"),
        Figure("kept steps", str(f["kept_steps"]), NONE, str(t["kept_steps"]),
               _x(ratios.get("kept_steps_faultlens_over_torchrun"))),
        Figure("lost steps", str(f["lost_steps"]), NONE, str(t["lost_steps"]),
               _x(ratios.get("lost_steps_torchrun_over_faultlens"))),
        Figure("ETTR", str(f["ettr"]), NONE, str(t["ettr"]),
               _x(ratios.get("ettr_faultlens_over_torchrun"))),
        Figure("goodput at the healthy step time", str(f.get("goodput_at_healthy_step", NONE)),
               NONE, str(t.get("goodput_at_healthy_step", NONE)),
               _x(ratios.get("goodput_faultlens_over_torchrun"))),
        Figure("kept steps per minute", str(f["kept_steps_per_min"]), NONE,
               str(t["kept_steps_per_min"]),
               _x(ratios.get("kept_steps_per_min_faultlens_over_torchrun"))),
        Figure("the software bug restarted", str(f["software_bug_restarts"]), "0",
               f"torchrun, the bug alone: {bug.get('software_bug_restarts', '?')}"),
        Figure("the software bug: seconds to stop", f"{f.get('software_bug_to_stop_s', NONE)} s",
               NONE,
               f"torchrun, the bug alone: {bug.get('software_bug_to_stop_s', '?')} s",
               _x(ratios.get("software_bug_to_stop_s_torchrun_over_faultlens")))]


def _attribute_scale(r: dict[str, Any]) -> list[Figure]:
    figures = []
    for run in r.get("results", [r]):
        size = (f"{run['nodes']} nodes x {run['gpus_per_node']} GPUs x {run['hours']:g} h "
                f"({_fmt(run['rows']['steps'])} step rows)")
        a = run["attribute"]
        figures += [
            Figure(f"{size}: `faultlens attribute` CPU",
                   f"{_fmt(a['cpu_s'])} s ({_fmt(a['wall_s'])} s wall)", "linear in the step rows"),
            Figure(f"{size}: peak RSS", f"{_fmt(a['peak_rss_mb'])} MB", "<= 1,536 MB"),
            Figure(f"{size}: incidents", str(run["incidents"]), "the engine before's",
                   f"the same as --compare's: {_yes(run.get('same_incidents'))}")]
    return figures


def _follow_listing(r: dict[str, Any]) -> list[Figure]:
    figures = []
    for run in r["runs"]:
        store = (f"{run['scenario']} ({_fmt(run['nodes'])} nodes, "
                 f"{_fmt(run['segments_in_store'])} segments)")
        after, before = run["after"], run["before"]
        figures += [
            Figure(f"{store}: list requests per poll", str(after["list_requests"][-1]), NONE,
                   f"every table listed whole: {before['list_requests'][-1]}",
                   _over(before["list_requests"][-1], after["list_requests"][-1])),
            Figure(f"{store}: segments handed to the tail per poll",
                   _fmt(after["segments_listed"]), NONE,
                   f"every table listed whole: {_fmt(before['segments_listed'])}",
                   _over(before["segments_listed"], after["segments_listed"]))]
        first = run.get("after_first_poll")
        if isinstance(first, dict):
            figures.append(Figure(f"{store}: list requests of the first poll (its window empty)",
                                  str(first.get("list_requests", NONE))))
    return figures


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("sink", "Store ingest: step rows into Parquet",
              "faultlens SegmentSink vs pandas DataFrame.to_parquet per batch",
              ("-m", "bench.bench_sink", "--rows", "2000000"),
              ("-m", "bench.bench_sink", "--rows", "200000"), _sink,
              notes=("pandas writes one plain file per batch: no partitioning, no atomic "
                     "visibility.",)),
    Benchmark("query", "Queries over the steps table",
              "DuckDB views over the Parquet layout vs pandas (read_parquet of the needed columns)",
              ("-m", "bench.bench_query", "--rows", "100000000"),
              ("-m", "bench.bench_query", "--rows", "2000000", "--ranks", "64"), _query, 3600.0),
    Benchmark("timer", "Step timer overhead on the training thread",
              "faultlens StepTimer vs a contextmanager + list of dicts + pandas",
              ("-m", "bench.bench_timer"),
              ("-m", "bench.bench_timer", "--steps", "2000", "--repeat", "2"), _timer),
    Benchmark("gpu", "GPU collector costs",
              "NVML source sample per GPU and kernel-log parsing vs naive shapes",
              ("bench/bench_gpu.py",), ("bench/bench_gpu.py", "--quick"), _gpu,
              notes=("The one regex per line misses the old-driver, MIG, SXid and "
                     "fallen-off-the-bus forms and reads no timestamps.",)),
    Benchmark("hang", "Hang analysis at scale",
              "faultlens analyze-hang vs torch's flight-recorder analyzer on the same dumps",
              ("-m", "bench.bench_hang", "--ranks", "1024,4096,16384"),
              ("-m", "bench.bench_hang", "--ranks", "64"), _hang, timeout_s=5400.0),
    Benchmark("live_lag", "Live lag: segment landing -> incident row",
              "attribute --follow vs re-running the batch pass",
              ("bench/bench_live_lag.py",),
              ("bench/bench_live_lag.py", "--runs", "3", "--ranks", "64"), _live_lag),
    Benchmark("restore", "Restore choice", "lazy verification vs verifying every checkpoint first",
              ("bench/bench_restore_choice.py",),
              ("bench/bench_restore_choice.py", "--steps", "4", "--ranks", "8"), _restore),
    Benchmark("delivery", "Decision delivery",
              "persist-then-deliver (at least once) vs a bare POST",
              ("bench/bench_decision_delivery.py",),
              ("bench/bench_decision_delivery.py", "--decisions", "20"), _delivery,
              notes=("The difference from the bare POST is the price of never losing a "
                     "decision.",)),
    Benchmark("eval", "Attribution accuracy on the simulated cluster",
              "faultlens eval on faultlens simulate",
              ("-m", "bench.bench_eval", "--seed", "1", "--replay"),
              ("-m", "bench.bench_eval", "--nodes", "4", "--hours", "4"), _eval,
              notes=("The faults follow the Llama 3 mix, with stragglers and benign noise.",)),
    Benchmark("demo_vs_torchrun", "The demo's faults: faultlens vs plain torchrun --max-restarts 3",
              "ETTR, lost steps, restarts of the software bug",
              ("-m", "bench.bench_demo_vs_torchrun"),
              ("-m", "bench.bench_demo_vs_torchrun", "--no-bug-run"), _vs,
              notes=("ETTR counts kept steps at their measured duration, so the plain run's "
                     "straggler-slowed steps count as productive; goodput at the healthy step "
                     "time and kept steps per minute show the straggler's cost.",
                     "faultlens resumes from older checkpoints because excluding a node drops "
                     "its local tier (the demo has no peer tier; durable every 10 steps).")),
    Benchmark("attribute_scale", "Attribution at scale: the batch pass in bounded memory",
              "`faultlens attribute` over simulated 16, 64 and 256 nodes x 8 GPUs x 24 h (the "
              "engine before: the same command with --tree)",
              ("-m", "bench.bench_attribute_scale", "--nodes", "16", "64", "256"),
              ("-m", "bench.bench_attribute_scale", "--nodes", "4", "--hours", "4", "--label",
               "quick"),
              _attribute_scale, timeout_s=5400.0),
    Benchmark("follow_listing", "Follower listing per poll",
              "the job's partitions from the window's dates vs every tailed table listed whole, on "
              "moto's S3 server", ("-m", "bench.bench_follow_listing"),
              ("-m", "bench.bench_follow_listing", "--nodes", "64", "--days", "3", "--polls", "1"),
              _follow_listing, timeout_s=3600.0),
)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip() or NONE
    except (OSError, subprocess.CalledProcessError):
        return NONE


def run_one(bench: Benchmark, quick: bool) -> dict[str, Any]:
    command = bench.command(quick)
    if not (ROOT / command[1]).exists() and command[1] == "-m" and not (
            ROOT / (command[2].replace(".", "/") + ".py")).exists():
        return {"error": f"{command[2]} is not in this checkout"}
    if command[1] != "-m" and not (ROOT / command[1]).exists():
        return {"error": f"{command[1]} is not in this checkout"}
    started = time.perf_counter()
    stamp = {"_commit": _commit(), "_date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")}
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=bench.timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {bench.timeout_s:.0f} s", **stamp}
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail), "seconds": seconds,
                **stamp}
    results = [json.loads(line) for line in proc.stdout.splitlines()
               if line.startswith('{"benchmark"')]
    if not results:
        try:
            results = [json.loads(proc.stdout)]
        except json.JSONDecodeError:
            start = proc.stdout.find("{")
            results = [json.loads(proc.stdout[start:])] if start >= 0 else []
    if not results:
        return {"error": "no JSON result printed", "seconds": seconds, **stamp}
    result = results[0] if len(results) == 1 else {"results": results}
    result["_seconds"] = round(seconds, 1)
    return {**result, **stamp}


def section(bench: Benchmark, result: dict[str, Any], quick: bool) -> Section:
    """The benchmark's published section for one raw result: its figures stamped with the run's
    commit and date, the machine it ran on among the notes."""
    commit, date = str(result.get("_commit", NONE)), str(result.get("_date", NONE))
    command = f"PYTHONPATH=. python {' '.join(bench.quick if quick else bench.full)}"
    if "error" in result:
        figures = [Figure("measured", f"not measured: {result['error']}", commit=commit, date=date)]
    else:
        try:
            figures = bench.figures(result)
        except (KeyError, TypeError, ValueError) as exc:
            figures = [Figure("measured", f"the result lacks {exc!r}")]
        figures = [replace(f, commit=commit, date=date) for f in figures]
    info = result.get("machine") if isinstance(result.get("machine"), dict) else None
    notes = list(bench.notes)
    if info:
        notes.append(f"Machine: {info.get('cpu')}, {info.get('cores')} cores, "
                     f"Python {info.get('python')}.")
    if quick:
        notes.append("Smoke run (--quick): small sizes, not the published figures.")
    return Section(bench.title, f"Compares: {bench.compares}.", (command,), tuple(figures),
                   tuple(notes))


def main() -> None:
    parser = argparse.ArgumentParser(description="run the benchmarks, publish docs/benchmarks.md")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only",
                        help="comma-separated keys: " + ",".join(b.key for b in BENCHMARKS))
    parser.add_argument("--out", help=f"default {PUBLISHED.relative_to(ROOT)}; with --quick, "
                                      "bench/out/benchmarks-quick.md")
    parser.add_argument("--merge", action="store_true",
                        help="keep earlier results of benchmarks not run now")
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else {b.key for b in BENCHMARKS}
    OUT.mkdir(parents=True, exist_ok=True)
    store = OUT / ("results-quick.json" if args.quick else "results.json")
    results: dict[str, dict[str, Any]] = (json.loads(store.read_text())
                                          if args.merge and store.exists() else {})
    for bench in BENCHMARKS:
        if bench.key not in wanted:
            continue
        print(f"running {bench.key} ...", file=sys.stderr, flush=True)
        results[bench.key] = run_one(bench, args.quick)
        outcome = results[bench.key].get("error")
        print(f"  {bench.key}: {'error: ' + outcome if outcome else 'ok'}", file=sys.stderr,
              flush=True)
        store.write_text(json.dumps(results, indent=1, default=str))
    sections = [section(b, results[b.key], args.quick) for b in BENCHMARKS if b.key in results]
    if args.quick:
        out = Path(args.out) if args.out else OUT / "benchmarks-quick.md"
        out.write_text(render_document(DOC_HEADER, sections))
    else:
        out = Path(args.out) if args.out else PUBLISHED
        for one in sections:
            write_section(out, one)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
