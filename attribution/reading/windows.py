"""The batch pass in bounded memory: one job's telemetry read from a store attempt by attempt,
DuckDB doing the reduction, so Python never holds an attempt's step rows (the bulk of a store) at
once, let alone the store's.

A job's small tables (ranks, process_events, gpu_events) are read whole: they grow with nodes x
attempts, not with time; its flight-recorder entries (collectives) one attempt at a time
(`attempt_context`). Its heartbeats (about a row per rank per second while it trains: 177 M a day at
2,048 ranks) are reduced like the steps: per (attempt, rank) the newest beat, the newest while
running, the first closed one, the oldest, the ones at the highest step, at the latest step end and
at the lowest step, the first of each NaN/Inf loss step (`heartbeat_digest_sqls`); and, for the
progress baseline's heartbeat fallback, every step of the lowest ranks until that fallback has what
it reads (`_heartbeat_history`). The steps table (a row per rank per step) is read per attempt, each
detector reading only what its answers depend on:
- what crash and hang attribution need of any attempt (where a rank ran, its last step and when,
  fingerprints of earlier attempts; when the next attempt started) is a max, min or latest row per
  (attempt, rank): DuckDB reduces the steps table to that `digest` (the rows holding the newest ts,
  the highest step, the latest end, the latest completion and the earliest start of each (attempt,
  rank, phase) group), so the detectors' own code, unchanged, finds the same answers in a few rows
  per rank as in every row;
- progress detection (`progress_window`): per step and phase the rows of the latest completion and
  the longest duration, per rank its latest completion and earliest start, every row of the step
  that completed last;
- loss detection (`loss_window`): the rows that carry a loss, and one row of each other rank;
- straggler scoring (`straggler_chunks`): the attempt's rows in chunks of consecutive steps,
  scattered chunk by chunk into the (step x rank) frames it scores (sections.score_chunks).

`JobWindows.open(store, job)` reads the small tables and the digest. `windowable` is False for a job
with rows of no attempt (NULL): the caller then reads that job whole. The engine hands these windows
to the detectors one attempt at a time through attribution/detectors/base.py AttemptPass, which
reads each on first use.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from faultlens.attribution.detectors.progress.monitor import HEARTBEAT_INTERVALS
from faultlens.attribution.reading.telemetry import (
    SECTION_PREFIX,
    Telemetry,
    job_nodes,
    sample_fetcher,
    sql_in_list,
    to_frame,
)
from faultlens.collectors.store.schema import Role, empty_table, schema_for, tables_with

#: job tables read whole (they grow with nodes and attempts, not with time)
SMALL_TABLES = tables_with(Role.READ_WHOLE)
#: the heartbeat rows each detector's reduction needs, per (attempt, rank [, extra group]): (rows,
#: pick, group)
HEARTBEAT_PICKS = (
    # the newest beat: where a rank runs, whether its timer closed
    ("TRUE", "arg_max({row}, ts)", ()),
    # the newest while running: alive after a failure
    ("NOT coalesce(closed, false)", "arg_max({row}, ts)", ()),
    # the first closed beat: when its timer closed
    ("coalesce(closed, false)", "arg_min({row}, ts)", ()),
    ("TRUE", "arg_min({row}, ts)", ()),  # the oldest beat: when the attempt started there
    ("step IS NOT NULL", "arg_max({row}, step)", ()),  # the last completed step
    # when the last step ended
    ("step IS NOT NULL AND step_ts IS NOT NULL", "arg_max({row}, step_ts)", ()),
    # the first known step (warm-up)
    ("step IS NOT NULL AND step_ts IS NOT NULL", "arg_min({row}, step)", ()),
    # the first beat of a NaN/Inf loss
    ("bad_loss_step IS NOT NULL", "arg_min({row}, ts)", ("bad_loss_step",)),
)
#: the step columns progress detection reads (attribution/detectors/progress/monitor.py): its window
#: holds only these
PROGRESS_COLUMNS = (
    "ts",
    "node",
    "job_id",
    "attempt",
    "rank",
    "step",
    "phase",
    "start_ts",
    "end_ts",
    "duration_s",
)
#: the step columns straggler scoring reads (attribution/detectors/straggler/sections.py)
STRAGGLER_COLUMNS = (
    "ts",
    "job_id",
    "attempt",
    "rank",
    "step",
    "phase",
    "start_ts",
    "end_ts",
    "duration_s",
    "sections",
)
#: the step columns loss detection reads (attribution/detectors/loss.py)
LOSS_COLUMNS = ("ts", "node", "job_id", "attempt", "rank", "step", "phase", "end_ts", "loss")
#: rows of one attempt's steps scored at a time (straggler scoring holds one chunk's rows, not the
#: attempt's)
CHUNK_ROWS = 262_144
#: tables whose attempts tell which windows a job has
ATTEMPT_TABLES = tables_with(Role.PER_ATTEMPT)


def digest_sqls() -> list[str]:
    """Per (attempt, rank, phase) of one job: the rows with the newest ts, the highest step, the
    latest end_ts, the latest completion (end_ts, else ts) and the earliest start (start_ts, else
    ts); without the sections map (no detector reading the digest scores sections). One query per
    pick, so DuckDB holds one aggregation's state (a row per group) at a time."""
    columns = [f.name for f in schema_for("steps") if f.name != "sections"]
    row = "struct_pack(" + ", ".join(f'"{c}" := "{c}"' for c in columns) + ")"
    picks = (f"arg_max({row}, ts)", f"arg_max({row}, step)", f"arg_max({row}, end_ts)",
             f"arg_max({row}, coalesce(end_ts, ts))", f"arg_min({row}, coalesce(start_ts, ts))")
    return [
        f"SELECT unnest(r) FROM (SELECT {pick} AS r FROM steps WHERE job_id = ? "
        "GROUP BY attempt, rank, coalesce(phase, 'train')) WHERE r IS NOT NULL"
        for pick in picks
    ]


def heartbeat_digest_sqls() -> list[str]:
    """One query per HEARTBEAT_PICKS entry over one job's heartbeats (the parameter), each the
    picked rows.
    """
    columns = [f.name for f in schema_for("heartbeats")]
    row = "struct_pack(" + ", ".join(f'"{c}" := "{c}"' for c in columns) + ")"
    return [f"SELECT unnest(r) FROM (SELECT {pick.format(row=row)} AS r FROM heartbeats WHERE "
            "job_id = ? AND "
            f"({where}) GROUP BY {', '.join(('attempt', 'rank', *group))}) WHERE r IS NOT NULL"
            for where, pick, group in HEARTBEAT_PICKS]


def _heartbeats(query: object, job: str, warmup_steps: int) -> pd.DataFrame:
    """The job's heartbeats as its detectors read them: the digest (heartbeat_digest_sqls) and the
    history the progress baseline's heartbeat fallback reads (_heartbeat_history), each row once."""
    digest = _joined([to_frame(query(sql, [job]), "heartbeats")  # type: ignore[operator]
                      for sql in heartbeat_digest_sqls()]).drop_duplicates(ignore_index=True)
    history = _heartbeat_history(query, job, digest, warmup_steps)
    return (
        _joined([digest, history]).drop_duplicates(ignore_index=True)
        if not history.empty
        else digest
    )


def _heartbeat_history(
    query: object, job: str, digest: pd.DataFrame, warmup_steps: int
) -> pd.DataFrame:
    """Per attempt, the beats of a known step from its first step + warm-up on, of its lowest ranks:
    rank by rank until they hold the HEARTBEAT_INTERVALS step intervals the progress baseline's
    fallback stops at (detectors/progress/monitor.py _heartbeat_intervals), so that it reads the
    same intervals as in every beat."""
    if digest.empty:
        return digest
    known = digest[digest["step"].notna() & digest["step_ts"].notna() & digest["attempt"].notna()]
    frames = []
    for attempt, rows in known.groupby("attempt"):
        first = int(rows["step"].min()) + warmup_steps
        ranks = sorted(int(r) for r in rows.loc[rows["step"] >= first, "rank"].dropna().unique())
        found, batch = 0, 1
        while ranks and found < HEARTBEAT_INTERVALS:
            chosen, ranks = ranks[:batch], ranks[batch:]
            marks = ", ".join("?" * len(chosen))
            beats = to_frame(
                query(  # type: ignore[operator]
                    "SELECT * FROM heartbeats WHERE job_id = ? AND attempt = ? "
                    f"AND rank IN ({marks}) "
                    "AND step IS NOT NULL AND step_ts IS NOT NULL AND step >= ?",
                    [job, int(attempt), *chosen, first],
                ),
                "heartbeats",
            )
            frames.append(beats)
            per_rank = (
                beats.drop_duplicates(["rank", "step"])
                .groupby("rank")
                .size()
                .reindex(chosen, fill_value=0)
            )
            for count in per_rank.to_numpy():  # in rank order, as the fallback reads them
                found += max(int(count) - 1, 0)
                if found >= HEARTBEAT_INTERVALS:
                    break
            batch *= 2
    return _joined(frames) if frames else digest.iloc[0:0]


def _digest(query: object, job: str) -> pd.DataFrame:
    """The job's steps digest (digest_sqls), each row once."""
    frames = [to_frame(query(sql, [job]), "steps") for sql in digest_sqls()]  # type: ignore[operator]
    return _joined(frames).drop_duplicates(ignore_index=True)


def _joined(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The rows of `frames` (at least one) as one frame: the empty ones left out, one alone returned
    as it is.
    """
    rows = [f for f in frames if not f.empty]
    return pd.concat(rows, ignore_index=True) if len(rows) > 1 else (rows[0] if rows else frames[0])


@dataclass(frozen=True)
class JobWindows:
    """One job of a store, read for a windowed batch pass."""

    store: object  # faultlens.attribution.reading.store.Store
    job: str
    context: Telemetry  # the job's small tables whole; steps: the digest of every attempt
    attempts: tuple[int, ...]
    windowable: bool
    # every section name of the job's steps (a column in each window)
    sections: tuple[str, ...] = ()

    @classmethod
    def open(
        cls, store: object, job: str, as_of: dt.datetime | None, *, warmup_steps: int = 0
    ) -> JobWindows:
        """`warmup_steps`: the progress thresholds' (which steps the heartbeat fallback of the
        baseline skips).
        """
        query = store.query  # type: ignore[attr-defined]
        frames = {name: to_frame(query(f'SELECT * FROM "{name}" WHERE job_id = ?', [job]), name)
                  for name in SMALL_TABLES}
        frames["heartbeats"] = _heartbeats(query, job, warmup_steps)
        digest = _digest(query, job)
        counts = query(" UNION ALL ".join(
            f"SELECT DISTINCT attempt FROM \"{name}\" WHERE job_id = ?" for name in ATTEMPT_TABLES),
            [job] * len(ATTEMPT_TABLES)).column("attempt").to_pylist()
        windowable = None not in counts
        attempts = tuple(sorted({int(a) for a in counts if a is not None}))
        steps_nodes = query(
            "SELECT DISTINCT node FROM steps WHERE job_id = ? AND node IS NOT NULL", [job]
        )
        nodes = sorted(
            set(job_nodes(frames["ranks"], frames["process_events"], frames["heartbeats"]))
            | {str(n) for n in steps_nodes.column("node").to_pylist()}
        )
        if nodes:
            gpu_events = to_frame(query("SELECT * FROM gpu_events WHERE node IN "
                                        f"({sql_in_list(nodes)}) OR job_id = ?", [job]),
                                  "gpu_events")
        else:
            gpu_events = to_frame(
                query("SELECT * FROM gpu_events WHERE job_id = ?", [job]), "gpu_events"
            )
        context = Telemetry(
            ranks=frames["ranks"],
            steps=digest,
            process_events=frames["process_events"],
            gpu_events=gpu_events,
            collectives=empty_table("collectives"),
            fetch_samples=sample_fetcher(store),
            jobs=(job,),
            as_of={job: as_of} if as_of is not None else {},
            heartbeats=frames["heartbeats"],
        )
        keys = query("SELECT DISTINCT unnest(map_keys(sections)) AS k FROM steps WHERE job_id = ? "
                     "AND sections IS "
                     "NOT NULL", [job]).column("k").to_pylist()
        return cls(
            store,
            job,
            context,
            attempts,
            windowable,
            tuple(sorted(k for k in keys if k is not None)),
        )

    @property
    def step_columns(self) -> list[str]:
        """The columns of an attempt's step rows as a frame (every section of the job a column)."""
        return (
            [f.name for f in schema_for("steps") if f.name != "sections"]
            + ["loss_nonfinite"]
            + [SECTION_PREFIX + k for k in self.sections]
        )

    def attempt_steps(self, attempt: int) -> pd.DataFrame:
        """Every step row of one attempt (in store order): the reference the reduced windows are
        checked against; the batch pass itself never holds them all."""
        return self._with_sections(self._steps("*", "attempt = ?", [attempt]))

    def attempt_context(self, attempt: int) -> Telemetry:
        """The job's context with the flight-recorder entries (collectives) of one attempt, and
        those of no attempt (what a dump set of that attempt is picked from:
        detectors/progress/dumps.py latest_dump_set)."""
        table = self.store.query("SELECT * FROM collectives WHERE job_id = ? AND (attempt = ? OR "
                                 "attempt IS NULL)",  # type: ignore[attr-defined]
                                 [self.job, attempt])
        return dataclasses.replace(
            self.context, collectives=table if table.num_rows else empty_table("collectives")
        )

    def attempt_digest(self, attempt: int) -> pd.DataFrame:
        """The digest rows of one attempt: where each rank ran (its newest row) and the attempt's
        highest step.
        """
        digest = self.context.steps
        return digest[digest["attempt"] == attempt] if not digest.empty else digest

    def straggler_chunks(self, attempt: int, rows: int = CHUNK_ROWS) -> Iterator[pd.DataFrame]:
        """One attempt's step rows with the columns straggler scoring reads, in chunks of about
        `rows` rows: disjoint step ranges in ascending order, every row of a step in one chunk (rows
        without a step are not scored), each in store order (sections.score_chunks)."""
        counts = self.store.query(  # type: ignore[attr-defined]
            "SELECT step, count(*) AS n FROM steps WHERE job_id = ? AND attempt = ? AND step IS "
            "NOT NULL "
            "GROUP BY step ORDER BY step", [self.job, attempt])
        for low, high in step_ranges(
            counts.column("step").to_numpy(), counts.column("n").to_numpy(), rows
        ):
            yield self._with_sections(self._steps(STRAGGLER_COLUMNS, "attempt = ? AND step BETWEEN "
                                                                     "? AND ?",
                                                  [attempt, low, high]))

    def progress_window(self, attempt: int) -> Telemetry:
        """The job's telemetry for progress detection over one attempt: of its step rows, only those
        the monitor's answers depend on (DuckDB picks them: per step and phase the latest completion
        and the longest duration, per rank its latest completion and earliest start, every row of
        the step that completed last), and of every other attempt one row saying when it started (an
        earlier attempt is observed until the next one started; a row without an end is no progress
        to check)."""
        row = "struct_pack(" + ", ".join(f'"{c}" := "{c}"' for c in PROGRESS_COLUMNS) + ")"
        where = "job_id = ? AND attempt = ?"
        done = "coalesce(end_ts, ts)"
        aggregated = (  # one query each: DuckDB holds one aggregation's state at a time
            f"SELECT unnest([arg_max({row}, {done}), arg_max({row}, duration_s)]) AS r FROM steps "
            f"WHERE {where} "
            "GROUP BY step, coalesce(phase, 'train')",
            f"SELECT unnest([arg_max({row}, {done}), arg_min({row}, coalesce(start_ts, ts))]) AS r "
            "FROM steps "
            f"WHERE {where} GROUP BY rank")
        query = self.store.query  # type: ignore[attr-defined]
        frames = [
            to_frame(
                query(f"SELECT unnest(r) FROM ({sql}) WHERE r IS NOT NULL", [self.job, attempt]),
                "steps",
            )
            for sql in aggregated
        ]
        # plain columns: a struct here defeats the pushdown
        last = ", ".join(f'"{c}"' for c in PROGRESS_COLUMNS)
        frames.append(to_frame(query(f"SELECT {last} FROM steps WHERE {where} AND step IN (SELECT "
                                     "step FROM steps "
                                     f"WHERE {where} AND {done} = (SELECT max({done}) FROM steps "
                                     f"WHERE {where}))",
                                     [self.job, attempt] * 3), "steps"))
        picked = (
            _joined(frames)
            .drop_duplicates()
            .sort_values(["ts", "rank", "step"], kind="stable", ignore_index=True)
        )
        digest = self.context.steps
        markers = _start_markers(
            digest[digest["attempt"] != attempt] if not digest.empty else digest
        )
        if not markers.empty:
            markers = markers[[c for c in PROGRESS_COLUMNS if c in markers.columns]]
            picked = markers if picked.empty else pd.concat([picked, markers], ignore_index=True)
        return dataclasses.replace(self.context, steps=picked)

    def loss_window(self, attempt: int) -> Telemetry:
        """The job's telemetry for loss detection over one attempt: its step rows that carry a loss
        (NaN and Inf included) and, of every rank without one, a row with no loss (a rank the
        attempt ran); the job's numerics rows of this attempt and the ones before it (a spike
        recognised across attempts)."""
        carried = self._steps(LOSS_COLUMNS, "attempt = ? AND loss IS NOT NULL", [attempt])
        others = self._steps(LOSS_COLUMNS, "attempt = ? AND loss IS NULL QUALIFY row_number() OVER "
                                           "(PARTITION BY rank ORDER BY ts) = 1", [attempt])
        numerics = to_frame(self.store.query(  # type: ignore[attr-defined]
            "SELECT * FROM numerics WHERE job_id = ? AND attempt <= ?", [self.job, attempt]),
            "numerics")
        return dataclasses.replace(self.context, steps=_joined([carried, others]),
                                   numerics=numerics)

    def _steps(
        self, columns: str | tuple[str, ...], where: str, params: list[object]
    ) -> pd.DataFrame:
        select = columns if isinstance(columns, str) else ", ".join(f'"{c}"' for c in columns)
        table = self.store.query(
            f"SELECT {select} FROM steps WHERE job_id = ? AND {where}",  # type: ignore
            [self.job, *params],
        )
        return to_frame(table, "steps")

    def _with_sections(self, rows: pd.DataFrame) -> pd.DataFrame:
        """As in a whole-job frame: sections of other attempts are columns, empty here."""
        missing = [
            SECTION_PREFIX + k for k in self.sections if SECTION_PREFIX + k not in rows.columns
        ]
        if missing and not rows.empty:
            rows = pd.concat(
                [rows, pd.DataFrame(np.nan, index=rows.index, columns=missing)], axis=1
            )
        return rows


def step_ranges(steps: np.ndarray, counts: np.ndarray, rows: int) -> list[tuple[int, int]]:
    """Consecutive ranges of `steps` (ascending, with their row counts) of about `rows` rows each; a
    step with more rows than that is a range of its own."""
    ranges: list[tuple[int, int]] = []
    low: int | None = None
    high = held = 0
    for step, count in zip(steps.tolist(), counts.tolist(), strict=True):
        if low is not None and held + count > rows:
            ranges.append((low, high))
            low, held = None, 0
        if low is None:
            low = step
        held += count
        high = step
    if low is not None:
        ranges.append((low, high))
    return ranges


def _start_markers(digest: pd.DataFrame) -> pd.DataFrame:
    """Per attempt of `digest`, a row holding only its job, attempt and earliest start (start_ts,
    else ts).
    """
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
    """Every job of a store (as a whole-store pass lists them: ranks, steps, process_events,
    heartbeats).
    """
    sql = " UNION ".join(f'SELECT DISTINCT job_id FROM "{name}" WHERE job_id IS NOT NULL'
                         for name in ("ranks", "steps", "process_events", "heartbeats"))
    table = store.query(sql)  # type: ignore[attr-defined]
    return sorted(str(j) for j in table.column("job_id").to_pylist())

