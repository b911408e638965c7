"""The batch pass in bounded memory: one job's telemetry read from a store attempt by attempt, DuckDB doing the
reduction, so Python holds one attempt's step rows (the bulk of a store) at a time, never the whole store.

A job's small tables (ranks, process_events, gpu_events, collectives, heartbeats) are read whole: they grow with
nodes x attempts, not with time. The steps table (a row per rank per step) is read in windows, one per attempt.
What a detector needs of the *other* attempts of a job (crash attribution: where a rank ran, its last step and
when, fingerprints of earlier attempts; progress: when the next attempt started) is a max, min or latest row per
(attempt, rank): DuckDB reduces the steps table to that `digest` (the rows holding the newest ts, the highest step,
the latest end and the earliest start of each (attempt, rank, phase) group), so the detectors' own
code, unchanged, finds the same answers in a few rows per rank as in every row.

`JobWindows.open(store, job)` reads the small tables and the digest; `attempt_steps(a)` the rows of one attempt,
`window(a, rows)` the telemetry each detector reads for it (the progress monitor: only the step columns it reads,
so its own copies of the rows stay small).
`windowable` is False for a job with rows of no attempt (NULL): the caller then reads that job whole.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

import numpy as np
import pandas as pd

from faultlens.attribution.telemetry import SECTION_PREFIX, Telemetry, _in_list, job_nodes, sample_fetcher, to_frame
from faultlens.collectors.store.schema import empty_table, schema_for

#: job tables read whole (they grow with nodes and attempts, not with time)
SMALL_TABLES = ("ranks", "process_events", "heartbeats")
#: the step columns progress detection reads (attribution/detectors/progress/monitor.py): its window holds only these
PROGRESS_COLUMNS = ("ts", "node", "job_id", "attempt", "rank", "step", "phase", "start_ts", "end_ts", "duration_s")
#: tables whose attempts tell which windows a job has
ATTEMPT_TABLES = ("ranks", "steps", "process_events", "heartbeats", "collectives")


def _digest_sql() -> str:
    """Per (attempt, rank, phase) of one job: the rows with the newest ts, the highest step, the latest
    end_ts, the latest completion (end_ts, else ts) and the earliest start (start_ts, else ts); without the
    sections map (no detector reading the digest scores sections)."""
    columns = [f.name for f in schema_for("steps") if f.name != "sections"]
    row = "struct_pack(" + ", ".join(f'"{c}" := "{c}"' for c in columns) + ")"
    picks = ", ".join((f"arg_max({row}, ts)", f"arg_max({row}, step)", f"arg_max({row}, end_ts)",
                       f"arg_max({row}, coalesce(end_ts, ts))", f"arg_min({row}, coalesce(start_ts, ts))"))
    return (f"SELECT DISTINCT unnest(r) FROM (SELECT unnest([{picks}]) AS r FROM steps WHERE job_id = ? "
            "GROUP BY attempt, rank, coalesce(phase, 'train')) WHERE r IS NOT NULL")


@dataclass(frozen=True)
class JobWindows:
    """One job of a store, read for a windowed batch pass."""

    store: object  # faultlens.attribution.store.Store
    job: str
    context: Telemetry  # the job's small tables whole; steps: the digest of every attempt
    attempts: tuple[int, ...]
    windowable: bool
    sections: tuple[str, ...] = ()  # every section name of the job's steps (a column in each window)

    @classmethod
    def open(cls, store: object, job: str, as_of: dt.datetime | None) -> JobWindows:
        query = store.query  # type: ignore[attr-defined]
        frames = {name: to_frame(query(f'SELECT * FROM "{name}" WHERE job_id = ?', [job]), name)
                  for name in SMALL_TABLES}
        collectives = query("SELECT * FROM collectives WHERE job_id = ?", [job])
        digest = to_frame(query(_digest_sql(), [job]), "steps")
        counts = query(" UNION ALL ".join(
            f"SELECT DISTINCT attempt FROM \"{name}\" WHERE job_id = ?" for name in ATTEMPT_TABLES),
            [job] * len(ATTEMPT_TABLES)).column("attempt").to_pylist()
        windowable = None not in counts
        attempts = tuple(sorted({int(a) for a in counts if a is not None}))
        steps_nodes = query("SELECT DISTINCT node FROM steps WHERE job_id = ? AND node IS NOT NULL", [job])
        nodes = sorted(set(job_nodes(frames["ranks"], frames["process_events"], frames["heartbeats"]))
                       | {str(n) for n in steps_nodes.column("node").to_pylist()})
        if nodes:
            gpu_events = to_frame(query(f"SELECT * FROM gpu_events WHERE node IN ({_in_list(nodes)}) OR job_id = ?",
                                        [job]), "gpu_events")
        else:
            gpu_events = to_frame(query("SELECT * FROM gpu_events WHERE job_id = ?", [job]), "gpu_events")
        context = Telemetry(ranks=frames["ranks"], steps=digest, process_events=frames["process_events"],
                            gpu_events=gpu_events,
                            collectives=collectives if collectives.num_rows else empty_table("collectives"),
                            fetch_samples=sample_fetcher(store), jobs=(job,),
                            as_of={job: as_of} if as_of is not None else {}, heartbeats=frames["heartbeats"])
        keys = query("SELECT DISTINCT unnest(map_keys(sections)) AS k FROM steps WHERE job_id = ? AND sections IS "
                     "NOT NULL", [job]).column("k").to_pylist()
        return cls(store, job, context, attempts, windowable, tuple(sorted(k for k in keys if k is not None)))

    def attempt_steps(self, attempt: int) -> pd.DataFrame:
        """Every step row of one attempt (in store order)."""
        table = self.store.query("SELECT * FROM steps WHERE job_id = ? AND attempt = ?",  # type: ignore[attr-defined]
                                 [self.job, attempt])
        rows = to_frame(table, "steps")
        missing = [SECTION_PREFIX + k for k in self.sections if SECTION_PREFIX + k not in rows.columns]
        if missing and not rows.empty:  # as in a whole-job frame: sections of other attempts are columns, empty here
            rows = pd.concat([rows, pd.DataFrame(np.nan, index=rows.index, columns=missing)], axis=1)
        return rows

    def window(self, attempt: int, rows: pd.DataFrame) -> Window:
        """The job's telemetry for the analyses of one attempt, given its step rows."""
        digest = self.context.steps
        markers = _start_markers(digest[digest["attempt"] != attempt] if not digest.empty else digest)
        slim = rows[[c for c in PROGRESS_COLUMNS if c in rows.columns]]
        if not markers.empty:
            markers = markers[[c for c in PROGRESS_COLUMNS if c in markers.columns]]
            slim = markers if slim.empty else pd.concat([slim, markers], ignore_index=True)
        return Window(attempt, with_context=self.context, with_starts=dataclasses.replace(self.context, steps=slim),
                      alone=dataclasses.replace(self.context, steps=rows))


@dataclass(frozen=True)
class Window:
    """One attempt's telemetry three ways. with_context: the job's context (crash and hang analyses look up
    placements and last steps of any attempt in the digest); with_starts: the attempt's step rows (the progress
    columns) and, of every other attempt, one row saying when it started and nothing else (progress: an earlier
    attempt is observed until the next one started; a row without an end is no progress to check); alone: the
    attempt's step rows only (straggler and loss scoring)."""

    attempt: int
    with_context: Telemetry
    with_starts: Telemetry
    alone: Telemetry


def _start_markers(digest: pd.DataFrame) -> pd.DataFrame:
    """Per attempt of `digest`, a row holding only its job, attempt and earliest start (start_ts, else ts)."""
    if digest.empty:
        return digest.iloc[0:0]
    start = digest["start_ts"].where(digest["start_ts"].notna(), digest["ts"])
    earliest = start.groupby(digest["attempt"]).idxmin().dropna()
    markers = digest.loc[earliest.to_numpy()].reset_index(drop=True)
    markers["start_ts"] = start.loc[earliest.to_numpy()].to_numpy()
    blank = pd.Series(False, index=markers.index)
    for column in markers.columns:
        if column not in ("job_id", "attempt", "start_ts"):
            markers[column] = markers[column].where(blank)
    return markers


def store_jobs(store: object) -> list[str]:
    """Every job of a store (as a whole-store pass lists them: ranks, steps, process_events, heartbeats)."""
    sql = " UNION ".join(f'SELECT DISTINCT job_id FROM "{name}" WHERE job_id IS NOT NULL'
                         for name in ("ranks", "steps", "process_events", "heartbeats"))
    table = store.query(sql)  # type: ignore[attr-defined]
    return sorted(str(j) for j in table.column("job_id").to_pylist())

