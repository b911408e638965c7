"""Row builders for the attribution tests: rows exactly as the interfaces of the helper brief
describe them (process_events of interface 3, gpu_events of interface 2, steps/ranks of the schema),
written into a real store through the real SegmentSink so every test reads them back through DuckDB.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from faultlens.collectors.store.sink import SegmentSink

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def write(store: Path | str, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
    with SegmentSink(str(store), flush_rows=10_000_000, flush_age_s=3600) as sink:
        sink.write(table, [dict(r) for r in rows])


def node_of(rank: int, per_node: int, prefix: str = "node-") -> str:
    return f"{prefix}{rank // per_node:02d}"


def ranks_rows(job: str, attempt: int, world: int, per_node: int, *, start: float = 0.0,
               pp_size: int | None = None, with_gpu: bool = True) -> list[dict[str, Any]]:
    rows = []
    for rank in range(world):
        local = rank % per_node
        row: dict[str, Any] = {
            "ts": at(start),
            "job_id": job,
            "attempt": attempt,
            "rank": rank,
            "local_rank": local,
            "node": node_of(rank, per_node),
            "world_size": world,
            "local_world_size": per_node,
            "pid": 1000 + rank,
        }
        if with_gpu:
            row.update(gpu_index=local, gpu_uuid=f"GPU-{rank // per_node:02d}{local:02d}aaaa",
                       pci_bus_id=f"00000000:{0x18 + local:02X}:00.0")
        if pp_size:
            row.update(pp_rank=rank % pp_size, pp_size=pp_size, dp_rank=rank // pp_size)
        rows.append(row)
    return rows


SectionFn = Callable[[int, int], Mapping[str, float]]


def steps_rows(
    job: str,
    attempt: int,
    world: int,
    per_node: int,
    steps: Iterable[int],
    *,
    start: float = 0.0,
    sections: SectionFn,
    comm_absorbs: bool = True,
    phase: Callable[[int], str] | None = None,
    step_gap: float = 0.0,
) -> list[dict[str, Any]]:
    """Synchronous steps: every rank's step ends when the slowest rank's compute ends (the others
    wait in `comm`), as real data-parallel training does."""
    rows = []
    clock = start
    for step in steps:
        compute = {rank: dict(sections(rank, step)) for rank in range(world)}
        totals = {rank: sum(s.values()) for rank, s in compute.items()}
        slowest = max(totals.values())
        duration = slowest + 0.01
        for rank in range(world):
            secs = dict(compute[rank])
            if comm_absorbs:
                secs["comm"] = duration - totals[rank]
            rows.append(
                {
                    "ts": at(clock + duration),
                    "job_id": job,
                    "attempt": attempt,
                    "rank": rank,
                    "local_rank": rank % per_node,
                    "node": node_of(rank, per_node),
                    "step": step,
                    "phase": phase(step) if phase else "train",
                    "start_ts": at(clock),
                    "end_ts": at(clock + duration),
                    "duration_s": duration,
                    "sections": secs,
                }
            )
        clock += duration + step_gap
    return rows


def event(kind: str, rank: int | None, seconds: float, *, job: str = "job-1", attempt: int = 0,
          node: str | None = None, per_node: int = 4, **columns: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "ts": at(seconds),
        "job_id": job,
        "attempt": attempt,
        "rank": rank,
        "kind": kind,
        "node": node
        if node is not None
        else (node_of(rank, per_node) if rank is not None else None),
    }
    if rank is not None:
        row["local_rank"] = rank % per_node
    row.update(columns)
    return row


def ingest_torch_artifacts(artifact: Path, store: Path, *, dumps: str | None = None,
                           job: str | None = None) -> None:
    """Put what a real torchrun scenario (interface 6) left into a store, through the producers' own
    readers: its step timer's store, its torchrun --log-dir tree and stderr report (the process
    source), and optionally a flight-recorder dump directory (the dump reader)."""
    import shutil

    from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
    from faultlens.collectors.sources.process_events import collect_paths

    if (artifact / "store").is_dir():
        shutil.copytree(artifact / "store", store, dirs_exist_ok=True)
    inputs = [p for p in (artifact / "logdir", artifact / "torchrun_stderr.txt") if p.exists()]
    collected = collect_paths(inputs)
    if collected.errors:
        raise AssertionError(f"process source could not read {artifact}: {collected.errors}")
    if collected.rows:
        with SegmentSink(str(store), flush_rows=10_000_000, flush_age_s=3600) as sink:
            sink.write("process_events", collected.table())
    if dumps is not None:
        from faultlens.collectors.sources.source import NodeIdentity

        identity = NodeIdentity(node=None, job_id=job) if job else None  # type: ignore[arg-type]
        dump_set = read_dump_dir(artifact / dumps, identity=identity)
        with SegmentSink(str(store), flush_rows=10_000_000, flush_age_s=3600) as sink:
            sink.write("collectives", dump_set.table)
