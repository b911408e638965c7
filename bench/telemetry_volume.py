"""Telemetry volume at scale, from measured bytes per row (docs/scale-out.md).

    PYTHONPATH=. python bench/telemetry_volume.py [--gpus 16384] [--gpus-per-node 8] [--sample-hz 1]
    [--step-s 5]

Writes real segments through the real SegmentSink (Parquet, zstd, the store layout) for each table,
the way the producers write them (a node agent flushes one segment per node every `--agent-flush-s`;
a rank's step timer one every `--timer-flush-s`), measures the bytes per row on disk as written and
after `compact` (one segment per partition), and scales the rates to the cluster:

- gpu_samples: one row per GPU per sample (random-walk temperatures, power, clocks, utilisation, an
  energy counter, occasional ECC/PCIe counter increments);
- steps: one row per rank per step (five sections, tokens, loss);
- gpu_events: `--events-per-gpu-hour` rows per GPU and hour (XIDs, thermal/power slowdowns, ECC,
  NVLink);
- collectives: the real NCCL flight-recorder dumps of tests/data/nccl-fr-gpu_error_2nd (16 ranks)
  read by the real reader; reported per hang dump of the whole job (`--fr-entries` entries per
  rank);
- process_events: per failure of the whole job (an exit row per rank plus an error row with a real
  traceback on every rank, as a software bug gives);
- ranks: per attempt (one row per rank).

The row contents are synthetic except collectives (real dumps); the byte counts are measured, not
assumed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import emit, machine  # noqa: E402
from faultlens.attribution.reading.maintenance import compact  # noqa: E402
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir  # noqa: E402
from faultlens.collectors.store.sink import SegmentSink  # noqa: E402

T0 = dt.datetime(2026, 11, 30, 0, 0, tzinfo=dt.UTC)
FR_DUMPS = REPO / "tests" / "data" / "nccl-fr-gpu_error_2nd"


def _files(root: Path, table: str) -> list[Path]:
    return [p for p in (root / table).rglob("*.parquet") if not p.name.startswith(".")]


def _measure(root: Path, table: str, rows: int) -> dict[str, float]:
    written = _files(root, table)
    as_written = sum(p.stat().st_size for p in written)
    compact(str(root), [table])
    merged = _files(root, table)
    compacted = sum(p.stat().st_size for p in merged)
    # the compactor records the names of the segments a file replaces in its footer
    # (faultlens.replaces, in the Parquet key-value metadata and again inside the serialized Arrow
    # schema): the footer grows with the number of segments merged, not with the data, so the
    # compacted size is reported without the footer, and the footer apart
    footers = sum(pq.ParquetFile(p).metadata.serialized_size for p in merged)
    return {
        "rows": rows,
        "segments_written": len(written),
        "rows_per_segment": rows / max(len(written), 1),
        "bytes_per_row_written": as_written / rows,
        "bytes_per_row_compacted": (compacted - footers) / rows,
        "compacted_footer_bytes_per_replaced_segment": footers / max(len(written), 1),
    }


def gpu_sample_rows(
    node: int, gpus: int, seconds: int, hz: float, rng: np.random.Generator
) -> list[dict]:
    """One node's samples, time-ordered (one row per GPU per sample)."""
    samples = int(seconds * hz)
    temp = 60 + rng.normal(0, 2, gpus)
    energy = rng.integers(10**9, 10**10, gpus)
    sbe = np.zeros(gpus, dtype=np.int64)
    replay = np.zeros(gpus, dtype=np.int64)
    rows = []
    for i in range(samples):
        ts = T0 + dt.timedelta(seconds=i / hz)
        temp = np.clip(temp + rng.normal(0, 0.4, gpus), 35, 90)
        power = rng.normal(640, 40, gpus).clip(80, 700)
        energy = energy + (power * 1000 / hz).astype(np.int64)
        sbe = sbe + (rng.random(gpus) < 0.001)
        replay = replay + (rng.random(gpus) < 0.002)
        throttled = rng.random(gpus) < 0.01
        for g in range(gpus):
            rows.append(
                {
                    "ts": ts,
                    "cluster": "cluster-a",
                    "node": f"node-{node:05d}",
                    "gpu_index": g,
                    "gpu_uuid": f"GPU-{node:08x}-{g:04x}-4c0d-9f00-1a2b3c4d5e6f",
                    "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0",
                    "source": "nvml_sample",
                    "gpu_name": "NVIDIA H100 80GB HBM3",
                    "temp_c": float(round(temp[g])),
                    "hbm_temp_c": float(round(temp[g] + 8)),
                    "power_w": float(round(power[g], 1)),
                    "energy_mj": int(energy[g]),
                    "sm_clock_mhz": 1755 if throttled[g] else 1980,
                    "mem_clock_mhz": 2619,
                    "gpu_util_pct": float(rng.integers(88, 101)),
                    "mem_util_pct": float(rng.integers(30, 60)),
                    "mem_used_bytes": 71 * 2**30 + int(rng.integers(0, 2**28)),
                    "mem_total_bytes": 80 * 2**30,
                    "clocks_event_reasons": 0x4 if throttled[g] else 0,
                    "ecc_sbe_volatile": int(sbe[g]),
                    "ecc_dbe_volatile": 0,
                    "ecc_sbe_aggregate": int(sbe[g]) + 12,
                    "ecc_dbe_aggregate": 0,
                    "retired_pages_sbe": 0,
                    "retired_pages_dbe": 0,
                    "retired_pages_pending": False,
                    "remapped_rows_correctable": 1,
                    "remapped_rows_uncorrectable": 0,
                    "remap_pending": False,
                    "remap_failure": False,
                    "recovery_action": 0,
                    "pcie_replay_count": int(replay[g]),
                    "nvlink_replay_errors": 0,
                    "nvlink_recovery_errors": 0,
                    "nvlink_crc_errors": 0,
                }
            )
    return rows


def step_rows(rank: int, steps: int, step_s: float, rng: np.random.Generator) -> list[dict]:
    rows, clock = [], T0
    for step in range(steps):
        duration = float(step_s * rng.normal(1, 0.01))
        sections = {
            "data": float(rng.uniform(0.001, 0.02)),
            "forward": duration * 0.31,
            "backward": duration * 0.58,
            "comm": duration * 0.08,
            "optimizer": duration * 0.03,
        }
        rows.append(
            {
                "ts": clock + dt.timedelta(seconds=duration),
                "cluster": "cluster-a",
                "node": f"node-{rank // 8:05d}",
                "job_id": "llm-405b",
                "attempt": 3,
                "rank": rank,
                "local_rank": rank % 8,
                "gpu_index": rank % 8,
                "step": 120_000 + step,
                "phase": "train",
                "start_ts": clock,
                "end_ts": clock + dt.timedelta(seconds=duration),
                "duration_s": duration,
                "sections": sections,
                "tokens": 16 * 2**20 // 2048,
                "samples": 8,
                "loss": float(1.8 + rng.normal(0, 0.01)),
            }
        )
        clock += dt.timedelta(seconds=duration + 0.002)
    return rows


EVENT_KINDS = [
    ("xid", 13, "Graphics Engine Exception"),
    ("xid", 31, "GPU memory page fault"),
    ("xid", 63, "ECC page retirement or row remapping recording event"),
    ("thermal_slowdown_start", None, "HW thermal slowdown"),
    ("power_slowdown_start", None, "HW power brake"),
    ("nvlink_error", None, "NVLink replay errors increased by 3"),
    ("ecc_sbe_storm", None, "SBE storm"),
]


def event_rows(count: int, nodes: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for i in range(count):
        kind, code, text = EVENT_KINDS[int(rng.integers(0, len(EVENT_KINDS)))]
        node, gpu = int(rng.integers(0, nodes)), int(rng.integers(0, 8))
        raw = (f"[{i * 3.7:12.6f}] NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): {code}, "
               f"pid=91{i % 1000:03d}, "
               f"name=python, {text}") if kind == "xid" else None
        rows.append(
            {
                "ts": T0 + dt.timedelta(seconds=i * 3.7),
                "cluster": "cluster-a",
                "node": f"node-{node:05d}",
                "gpu_index": gpu,
                "gpu_uuid": f"GPU-{node:08x}-{gpu:04x}-4c0d-9f00-1a2b3c4d5e6f",
                "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                "source": "kmsg" if raw else "nvml_event",
                "kind": kind,
                "code": code,
                "message": text,
                "pid": 91000 + i % 1000 if raw else None,
                "process_name": "python" if raw else None,
                "raw": raw,
            }
        )
    return rows


def _a_real_traceback() -> tuple[str, str]:
    def load_batch(batch: dict) -> Any:
        return batch["labels"]

    try:
        load_batch({"inputs": None})
    except KeyError as exc:
        return repr(exc), "".join(traceback.format_exception(exc))
    raise AssertionError("unreachable")


def failure_rows(ranks: int) -> list[dict]:
    message, trace = _a_real_traceback()
    rows = []
    for rank in range(ranks):
        base = {
            "ts": T0,
            "cluster": "cluster-a",
            "node": f"node-{rank // 8:05d}",
            "job_id": "llm-405b",
            "attempt": 3,
            "rank": rank,
            "local_rank": rank % 8,
            "pid": 50_000 + rank,
        }
        rows.append(
            {
                **base,
                "kind": "exception",
                "source": "error_json",
                "exception_type": "KeyError",
                "message": message,
                "traceback": trace,
                "fingerprint": "d4970394471b5850",
                "is_secondary": False,
                "step": 120_345,
                "error_file": f"/tmp/torchelastic/{rank}/error.json",
            }
        )
        rows.append(
            {
                **base,
                "kind": "exit",
                "source": "torchrun_report",
                "exit_code": 1,
                "is_secondary": False,
            }
        )
    return rows


def _write(root: Path, table: str, batches: list[list[dict]]) -> int:
    with SegmentSink(str(root), flush_rows=10**9, flush_age_s=10**9) as sink:
        for rows in batches:
            sink.write(table, rows)
            sink.flush(table)
    return sum(len(rows) for rows in batches)


def measure_tables(workdir: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(7)
    measured: dict[str, dict[str, float]] = {}

    root = workdir / "gpu_samples"
    per_flush = max(1, round(args.agent_flush_s * args.sample_hz))
    batches = []
    for node in range(4):
        rows = gpu_sample_rows(node, args.gpus_per_node, args.sample_seconds, args.sample_hz, rng)
        step = per_flush * args.gpus_per_node
        batches += [rows[i:i + step] for i in range(0, len(rows), step)]
    measured["gpu_samples"] = _measure(root, "gpu_samples", _write(root, "gpu_samples", batches))

    for name, flush_s in (
        ("steps", args.timer_flush_s),
        ("steps_batched", args.timer_batched_flush_s),
    ):
        root = workdir / name
        per_flush = max(1, math.floor(flush_s / args.step_s))
        batches = []
        for rank in range(16):
            rows = step_rows(rank, args.steps, args.step_s, rng)
            batches += [rows[i:i + per_flush] for i in range(0, len(rows), per_flush)]
        measured[name] = _measure(root, "steps", _write(root, "steps", batches))

    root = workdir / "gpu_events"
    # one day of 4 nodes at the event rate; the agent writes an event's segment within its flush
    # interval, so events this rare land one per segment
    count = int(4 * args.gpus_per_node * 24 * args.events_per_gpu_hour)
    rows = sorted(event_rows(count, 4, rng), key=lambda row: row["ts"])
    for i, row in enumerate(rows):
        row["ts"] = T0 + dt.timedelta(seconds=i * 86_400 / count)
    measured["gpu_events"] = _measure(
        root, "gpu_events", _write(root, "gpu_events", [[row] for row in rows])
    )

    root = workdir / "collectives"
    dumps = read_dump_dir(FR_DUMPS).table
    measured["collectives"] = _measure(
        root, "collectives", _write(root, "collectives", [dumps.to_pylist()])
    )
    measured["collectives"]["entries_per_rank_in_sample"] = dumps.num_rows / 16

    root = workdir / "process_events"
    rows = failure_rows(256)
    measured["process_events"] = _measure(
        root, "process_events", _write(root, "process_events", [rows])
    )
    return measured


def at_scale(
    measured: dict[str, dict[str, float]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    gpus, nodes = args.gpus, args.gpus // args.gpus_per_node
    continuous: list[tuple[str, str, float, float, str]] = [
        # name, table, rows/s, segments/s written by the producers, rate basis
        (
            "gpu_samples",
            "gpu_samples",
            gpus * args.sample_hz,
            nodes / args.agent_flush_s,
            f"1 row/GPU every {1 / args.sample_hz:g} s; each node agent writes a segment every "
            f"{args.agent_flush_s:g} s",
        ),
        (
            "steps",
            "steps",
            gpus / args.step_s,
            gpus / max(args.timer_flush_s, args.step_s),
            f"1 row/rank/step, {args.step_s:g} s steps; each rank's timer writes every "
            f"{args.timer_flush_s:g} s "
            "(the default)",
        ),
        (
            "steps_batched",
            "steps",
            gpus / args.step_s,
            gpus / max(args.timer_batched_flush_s, args.step_s),
            f"as above, timer flush_interval_s={args.timer_batched_flush_s:g}",
        ),
        (
            "gpu_events",
            "gpu_events",
            gpus * args.events_per_gpu_hour / 3600,
            nodes
            / args.agent_flush_s
            * min(1.0, args.gpus_per_node * args.events_per_gpu_hour * args.agent_flush_s / 3600),
            f"{args.events_per_gpu_hour:g} events/GPU/hour",
        ),
    ]
    out = []
    for name, table, rows_s, segments_s, basis in continuous:
        m = measured[name]
        out.append(
            {
                "table": table,
                "basis": basis,
                "rows_per_s": rows_s,
                "segments_per_s": segments_s,
                "bytes_per_row_written": m["bytes_per_row_written"],
                "bytes_per_row_compacted": m["bytes_per_row_compacted"],
                "mb_per_s_written": rows_s * m["bytes_per_row_written"] / 1e6,
                "gb_per_day_compacted": rows_s * m["bytes_per_row_compacted"] * 86_400 / 1e9,
            }
        )
    fr_rows = gpus * args.fr_entries
    out.append(
        {
            "table": "collectives",
            "basis": f"per hang dump: {args.fr_entries} entries x {gpus} ranks",
            "rows_per_event": fr_rows,
            "bytes_per_row_written": measured["collectives"]["bytes_per_row_written"],
            "gb_per_event": fr_rows * measured["collectives"]["bytes_per_row_written"] / 1e9,
        }
    )
    pe_rows = 2 * gpus
    out.append(
        {
            "table": "process_events",
            "basis": f"per job failure: exit + error row (traceback) x {gpus} ranks",
            "rows_per_event": pe_rows,
            "bytes_per_row_written": measured["process_events"]["bytes_per_row_written"],
            "gb_per_event": pe_rows * measured["process_events"]["bytes_per_row_written"] / 1e9,
        }
    )
    return out


def markdown(
    rows: list[dict[str, Any]], measured: dict[str, dict[str, float]], args: argparse.Namespace
) -> str:
    fmt: Callable[[float], str] = lambda x: f"{x:,.1f}" if x < 100 else f"{x:,.0f}"  # noqa: E731
    lines = [f"Telemetry at {args.gpus:,} GPUs ({args.gpus // args.gpus_per_node:,} nodes), bytes "
             "per row measured "
             "on real Parquet segments written by the sink (as written / after compaction):", "",
             "| table | rate | rows/s | segments/s | B/row written | B/row compacted | MB/s "
             "written | "
             "GB/day compacted |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "rows_per_s" in r:
            lines.append(f"| {r['table']} | {r['basis']} | {fmt(r['rows_per_s'])} | "
                         f"{fmt(r['segments_per_s'])} | "
                         f"{fmt(r['bytes_per_row_written'])} | {fmt(r['bytes_per_row_compacted'])} "
                         "| "
                         f"{fmt(r['mb_per_s_written'])} | {fmt(r['gb_per_day_compacted'])} |")
    lines += ["", "| table | per event | rows | B/row | GB |", "|---|---|---:|---:|---:|"]
    for r in rows:
        if "rows_per_event" in r:
            lines.append(f"| {r['table']} | {r['basis']} | {r['rows_per_event']:,} | "
                         f"{fmt(r['bytes_per_row_written'])} | {r['gb_per_event']:.2f} |")
    lines += ["", "Segments as the producers write them: " + ", ".join(
        f"{t} {m['rows_per_segment']:.0f} rows/segment" for t, m in measured.items())]
    most = max(measured.values(), key=lambda m: m["segments_written"])
    footer = most["compacted_footer_bytes_per_replaced_segment"]
    lines += ["Compacted: one segment per partition (table/job/date/node) holding everything "
              "measured for it; B/row "
              "compacted counts its data pages, not its footer, which lists the segments it "
              "replaced (about "
              f"{footer:.0f} B of footer per replaced segment)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=16_384)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--sample-hz", type=float, default=1.0, help="NVML samples per GPU per "
                                                                     "second")
    parser.add_argument("--step-s", type=float, default=5.0, help="training step time")
    parser.add_argument("--agent-flush-s", type=float, default=5.0, help="node agent segment "
                                                                         "interval (--flush-age)")
    parser.add_argument("--timer-flush-s", type=float, default=2.0,
                        help="step timer segment interval (StepTimer's default flush_interval_s)")
    parser.add_argument("--timer-batched-flush-s", type=float, default=60.0,
                        help="a longer step timer interval to compare with")
    parser.add_argument("--events-per-gpu-hour", type=float, default=1.0)
    parser.add_argument("--fr-entries", type=int, default=2000, help="flight-recorder entries per "
                                                                     "rank per dump")
    parser.add_argument("--sample-seconds", type=int, default=600, help="simulated seconds of "
                                                                        "gpu_samples per node")
    parser.add_argument("--steps", type=int, default=240, help="simulated steps per rank")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="faultlens-volume-") as tmp:
        measured = measure_tables(Path(tmp), args)
    rows = at_scale(measured, args)
    result = {
        "machine": machine(),
        "args": vars(args) | {"json": None},
        "measured": measured,
        "at_scale": rows,
    }
    print(markdown(rows, measured, args))
    emit("telemetry_volume", {"measured": measured, "at_scale": rows})
    if args.json:
        os.makedirs(args.json.parent, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
