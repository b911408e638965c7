"""Section timing: which section columns are own work, communication or unknown; own time (nested
communication taken out of its parent); one attempt's rows scattered into (step x rank) frames and
decomposed into StepScores."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from faultlens.attribution.detectors.straggler.decompose import decompose
from faultlens.attribution.detectors.straggler.layout import build_layout
from faultlens.attribution.detectors.straggler.report import (
    SYNC_OPS,
    UNKNOWN_SHARE_REPORTED,
    StepScores,
)
from faultlens.attribution.detectors.straggler.vocab import CUDA_PREFIX, SectionKind, Vocabulary
from faultlens.attribution.reading.telemetry import SECTION_PREFIX, Placement, section_columns
from faultlens.attribution.rules import StragglerThresholds

_ROW_COLUMNS = ("step", "rank", "phase", "ts", "start_ts", "end_ts", "duration_s")


def classify_sections(
    t: StragglerThresholds, vocabulary: Vocabulary, steps: pd.DataFrame
) -> tuple[list[str], dict[str, str], list[str]]:
    """(own-work section columns, comm section -> collective kind, unknown section names)."""
    names = [c[len(SECTION_PREFIX) :] for c in section_columns(steps)]
    excluded = [e.lower() for e in t.exclude_sections]
    names = [n for n in names if not any(e in n.lower() for e in excluded)]
    chosen, classes = vocabulary.scored(names)
    comm = {n: c.op or "other" for n, c in classes.items() if c.kind is SectionKind.COMM}
    unknown = [n for n, c in classes.items() if c.kind is SectionKind.UNKNOWN]
    return [SECTION_PREFIX + n for n in chosen], comm, unknown


def accounted_sections(
    sections: list[str], comm: dict[str, str], unknown: list[str], present: Iterable[str]
) -> list[str]:
    """The section columns whose seconds add up to the time a step's timers account for, each
    second once: the scored own work (its nested communication taken out by own_time), the
    communication outside any other timed section or at the top of a scored one's, the unknown
    outside any other timed section. Wrappers, excluded phases and nested parts are not added."""
    names = {c[len(SECTION_PREFIX) :] for c in present if c.startswith(SECTION_PREFIX)}
    chosen = {c[len(SECTION_PREFIX) :] for c in sections}

    def ancestors(name: str) -> list[str]:
        path = name[len(CUDA_PREFIX) :] if name.startswith(CUDA_PREFIX) else name
        parts = path.split("/")
        return [a for a in ("/".join(parts[:k]) for k in range(1, len(parts))) if a in names]

    out = list(sections)
    for name in comm:
        if name.startswith(CUDA_PREFIX) and name[len(CUDA_PREFIX) :] in names:
            continue
        above = ancestors(name)
        if all(a in chosen for a in above):
            out.append(SECTION_PREFIX + name)
    out += [
        SECTION_PREFIX + n
        for n in unknown
        if not ancestors(n) and not (n.startswith(CUDA_PREFIX) and n[len(CUDA_PREFIX) :] in names)
    ]
    return [c for c in out if c in present]


def own_time(
    steps: pd.DataFrame, sections: list[str], comm: dict[str, str]
) -> dict[str, pd.Series]:
    """The own-work section columns that hold communication timed inside them (`forward/recv` in
    `forward`), with that time taken out: a stage waiting for its neighbour in a nested recv has not
    computed for longer. Only the outermost communication below a section counts (an inner one is
    inside it already)."""
    adjusted = {}
    for column in sections:
        name = column[len(SECTION_PREFIX) :]
        inner = [
            n
            for n in comm
            if n.startswith(name + "/")
            and not any(
                n.startswith(other + "/")
                for other in comm
                if other != n and other.startswith(name + "/")
            )
            and SECTION_PREFIX + n in steps.columns
        ]
        if not inner:
            continue
        waits = steps[[SECTION_PREFIX + n for n in inner]].astype(float).fillna(0.0).sum(axis=1)
        adjusted[column] = (steps[column].astype(float) - waits).clip(lower=0.0)
    return adjusted


class Matrix:
    """Scatters per-row values into a (step x rank) frame; a (step, rank) given twice gets the
    mean."""

    def __init__(self, steps: np.ndarray, ranks: np.ndarray) -> None:
        self.steps, step_of = np.unique(steps, return_inverse=True)
        self.ranks, rank_of = np.unique(ranks, return_inverse=True)
        self.cells = step_of * len(self.ranks) + rank_of
        self.shape = (len(self.steps), len(self.ranks))
        self.unique: bool | None = None

    def frame(self, values: np.ndarray) -> pd.DataFrame:
        if self.unique is None:
            self.unique = int(np.bincount(self.cells, minlength=1).max()) <= 1
        if self.unique:  # one row per (step, rank): scatter directly
            out = np.full(self.shape[0] * self.shape[1], np.nan)
            out[self.cells] = values
            return pd.DataFrame(
                out.reshape(self.shape),
                index=pd.Index(self.steps, name="step"),
                columns=pd.Index(self.ranks, name="rank"),
            )
        finite = ~np.isnan(values)
        size = self.shape[0] * self.shape[1]
        total = np.bincount(self.cells[finite], weights=values[finite], minlength=size)
        count = np.bincount(self.cells[finite], minlength=size)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / np.maximum(count, 1), np.nan).reshape(self.shape)
        return pd.DataFrame(
            mean, index=pd.Index(self.steps, name="step"), columns=pd.Index(self.ranks, name="rank")
        )


def _scored_rows(
    t: StragglerThresholds,
    attempt_steps: pd.DataFrame,
    sections: list[str],
    comm: dict[str, str],
    unknown: list[str],
    sync_columns: list[str],
    first_step: float | None,
    accounted: list[str] | None = None,
) -> tuple[pd.DataFrame | None, float | None]:
    """The rows that count (a step and a rank, a scored phase, past warm-up, some own work timed),
    own time in the section columns and their total in `_compute` (None when no row is left), and
    the attempt's first scored step (`first_step`: the one an earlier chunk of the attempt found;
    warm-up counts from it)."""
    wanted = [c for c in _ROW_COLUMNS if c in attempt_steps.columns]
    columns = list(
        dict.fromkeys(wanted + sections + [SECTION_PREFIX + n for n in unknown] + sync_columns)
    )
    rows = attempt_steps[columns]
    rows = rows.assign(**own_time(attempt_steps, sections, comm))
    if accounted:
        # the seconds the step's timers account for (own work as own time, plus the waits)
        timed = pd.concat(
            [rows[c] if c in rows.columns else attempt_steps[c] for c in accounted], axis=1
        ).to_numpy(dtype=float, na_value=np.nan)
        rows = rows.assign(
            _accounted=np.where(np.isfinite(timed).any(axis=1), np.nansum(timed, axis=1), np.nan)
        )
    keep = (rows["step"].notna() & rows["rank"].notna()).to_numpy().copy()
    if "phase" in rows.columns:
        phase = rows["phase"].astype(object)
        keep &= phase.where(phase.notna(), "train").isin(t.phases).to_numpy()
    if not keep.any():
        return None, first_step
    step_values = rows["step"].to_numpy(dtype=float, na_value=np.nan)
    if first_step is None:
        first_step = float(np.nanmin(step_values[keep]))
    keep &= step_values >= first_step + t.warmup_steps
    own = rows[sections].to_numpy(dtype=float, na_value=np.nan)
    total_compute = np.where(np.isfinite(own).any(axis=1), np.nansum(own, axis=1), np.nan)
    keep &= np.isfinite(total_compute)
    if not keep.any():
        return None, first_step
    rows = rows[keep].assign(_compute=total_compute[keep])
    return rows.assign(
        step=rows["step"].astype(np.int64), rank=rows["rank"].astype(np.int64)
    ), first_step


def _step_times(rows: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Per row: (when the step ended, when it began, its duration in seconds)."""
    done = (
        rows["end_ts"].where(rows["end_ts"].notna(), rows["ts"])
        if "end_ts" in rows.columns
        else rows["ts"]
    )
    begun = (
        rows["start_ts"].where(rows["start_ts"].notna(), done)
        if "start_ts" in rows.columns
        else done
    )
    duration = (
        rows["duration_s"].astype(float)
        if "duration_s" in rows.columns
        else pd.Series(np.nan, index=rows.index)
    )
    duration = duration.where(duration.notna(), (done - begun).dt.total_seconds())
    if "_accounted" in rows.columns:
        # a step lasts at least the seconds its timers account for (rows of a parsed log carry the
        # log line's time, not the step's: their span is one timer's)
        duration = np.fmax(duration, rows["_accounted"].astype(float))
    return done, begun, duration


def _spans_are_schedules(rows: pd.DataFrame) -> bool:
    """Whether the rows' timestamps place each rank's step in time (what the data-parallel sync's
    arrivals are read from): not so where most rows' timers account for more than their span (the
    timers of a parsed log, stamped with the log line's time and each holding a mean per step)."""
    if "_accounted" not in rows.columns:
        return True
    done = rows["end_ts"] if "end_ts" in rows.columns else rows["ts"]
    begun = rows["start_ts"] if "start_ts" in rows.columns else done
    span = (done - begun).dt.total_seconds().to_numpy(dtype=float, na_value=np.nan)
    accounted = rows["_accounted"].to_numpy(dtype=float, na_value=np.nan)
    known = np.isfinite(span) & np.isfinite(accounted)
    if not known.any():
        return True
    over = accounted[known] > 1.05 * span[known] + 1e-3
    return float(over.mean()) < 0.5


def _sync_frames(
    rows: pd.DataFrame, matrix: Matrix, sync_columns: list[str], done: pd.Series
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(seconds in the data-parallel sync, each rank's step end in epoch seconds), where the sync is
    timed.
    """
    if not sync_columns:
        return None, None
    waits = rows[sync_columns].to_numpy(dtype=float, na_value=np.nan)
    sync = matrix.frame(np.where(np.isfinite(waits).any(axis=1), np.nansum(waits, axis=1), np.nan))
    stamps = pd.to_datetime(done, utc=True, errors="coerce")
    epoch = (
        (stamps - pd.Timestamp(0, tz="UTC"))
        .dt.total_seconds()
        .to_numpy(dtype=float, na_value=np.nan)
    )
    return sync, matrix.frame(epoch)


@dataclass(frozen=True)
class _Chunk:
    """The (step x rank) frames and per-step figures of one chunk of an attempt's scored rows."""

    compute: pd.DataFrame
    sections: dict[str, pd.DataFrame]  # every own-work section, timed in this chunk or not
    timed: set[str]  # the sections some row of this chunk timed
    step_s: pd.Series  # per step: the median step time over ranks
    start_ts: pd.Series  # per step: earliest start
    end_ts: pd.Series  # per step: latest end
    sync: pd.DataFrame | None
    ends: pd.DataFrame | None
    unknown_s: dict[str, float]  # unknown section -> seconds timed in this chunk
    duration_s: float  # seconds of step time in this chunk


def _chunk_frames(
    rows: pd.DataFrame, sections: list[str], sync_columns: list[str], unknown: list[str]
) -> _Chunk:
    matrix = Matrix(rows["step"].to_numpy(), rows["rank"].to_numpy())
    compute = matrix.frame(rows["_compute"].to_numpy(dtype=float))
    frames = {
        c[len(SECTION_PREFIX) :]: matrix.frame(rows[c].to_numpy(dtype=float)) for c in sections
    }
    timed = {c[len(SECTION_PREFIX) :] for c in sections if rows[c].notna().any()}
    done, begun, duration = _step_times(rows)
    step_s = matrix.frame(duration.to_numpy(dtype=float)).median(axis=1)
    sync, ends = _sync_frames(
        rows, matrix, sync_columns if _spans_are_schedules(rows) else [], done
    )
    unknown_s = {
        n: float(rows[SECTION_PREFIX + n].astype(float).sum())
        for n in unknown
        if SECTION_PREFIX + n in rows.columns
    }
    return _Chunk(
        compute,
        frames,
        timed,
        step_s,
        begun.groupby(rows["step"]).min(),
        done.groupby(rows["step"]).max(),
        sync,
        ends,
        unknown_s,
        float(np.nansum(duration.to_numpy(dtype=float))),
    )


def _stacked(frames: list[pd.DataFrame], ranks: pd.Index) -> pd.DataFrame:
    """(step x rank) frames of consecutive step ranges as one frame over every rank (NaN where a
    rank has no row in a chunk), as one Matrix over all the rows would have made it."""
    if len(frames) == 1 and frames[0].columns.equals(ranks):
        return frames[0]
    return pd.concat([f.reindex(columns=ranks) for f in frames], axis=0)


def _unknown_shares(chunks: list[_Chunk], unknown: list[str]) -> dict[str, float]:
    """Unknown section -> its share of step time, where it holds at least UNKNOWN_SHARE_REPORTED."""
    shares = {}
    total = sum(c.duration_s for c in chunks)
    for name in unknown:
        timed = [c.unknown_s[name] for c in chunks if name in c.unknown_s]
        if timed and total > 0:
            share = sum(timed) / total
            if share >= UNKNOWN_SHARE_REPORTED:
                shares[name] = share
    return shares


def score_steps(
    t: StragglerThresholds,
    vocabulary: Vocabulary,
    attempt_steps: pd.DataFrame,
    placement: dict[int, Placement],
    ranks_table: pd.DataFrame | None = None,
    attempt: int | None = None,
) -> StepScores | None:
    """Score one attempt's steps; None when there is nothing to score (no own-work sections, no
    steps).
    """
    chunks = (attempt_steps,) if not attempt_steps.empty else ()
    return score_chunks(
        t, vocabulary, list(attempt_steps.columns), chunks, placement, ranks_table, attempt
    )


def score_chunks(
    t: StragglerThresholds,
    vocabulary: Vocabulary,
    columns: list[str],
    chunks: Iterable[pd.DataFrame],
    placement: dict[int, Placement],
    ranks_table: pd.DataFrame | None = None,
    attempt: int | None = None,
) -> StepScores | None:
    """Score one attempt whose step rows come in chunks (each a frame with `columns`): the chunks
    hold disjoint step ranges in ascending order, every row of a step in one chunk (rows without a
    step are not scored). Memory holds one chunk's rows and the (step x rank) frames, never every
    row; the StepScores are those of one frame of all the rows. None when there is nothing to score
    (no own-work sections, no steps)."""
    sections, comm, unknown = classify_sections(t, vocabulary, pd.DataFrame(columns=columns))
    if not sections:
        return None
    sync_columns = [
        SECTION_PREFIX + n
        for n, op in comm.items()
        if op in SYNC_OPS and SECTION_PREFIX + n in columns
    ]
    accounted = accounted_sections(sections, comm, unknown, columns)
    scored: list[_Chunk] = []
    first_step: float | None = None
    for chunk in chunks:
        rows, first_step = _scored_rows(
            t, chunk, sections, comm, unknown, sync_columns, first_step, accounted
        )
        if rows is not None:
            scored.append(_chunk_frames(rows, sections, sync_columns, unknown))
        del rows, chunk
    if not scored:
        return None
    ranks = pd.Index(
        np.unique(np.concatenate([c.compute.columns.to_numpy() for c in scored])), name="rank"
    )
    compute = _stacked([c.compute for c in scored], ranks)
    if not (compute.index.is_monotonic_increasing and compute.index.is_unique):
        raise ValueError(
            "straggler scoring: chunks of an attempt must hold disjoint, ascending step ranges"
        )
    timed = set().union(*(c.timed for c in scored))
    section_frames = {}
    for column in sections:
        name = column[len(SECTION_PREFIX) :]
        if name in timed:
            section_frames[name] = _stacked([c.sections[name] for c in scored], ranks)
        for c in scored:
            del c.sections[name]
    step_s = pd.concat([c.step_s for c in scored]).to_numpy(dtype=float)
    timed_sync = sync_columns and all(c.sync is not None for c in scored)
    sync = _stacked([c.sync for c in scored], ranks) if timed_sync else None
    ends = _stacked([c.ends for c in scored], ranks) if timed_sync else None
    start_ts = pd.concat([c.start_ts for c in scored]).reindex(compute.index)
    end_ts = pd.concat([c.end_ts for c in scored]).reindex(compute.index)
    unknown_shares = _unknown_shares(scored, unknown)
    del scored  # the chunks' frames: each is in a stacked frame now
    layout = build_layout(
        list(compute.columns),
        ranks_table if ranks_table is not None else pd.DataFrame(),
        attempt,
        placement,
    )
    parts = decompose(
        compute.to_numpy(dtype=float),
        {k: v.to_numpy(dtype=float) for k, v in section_frames.items()},
        layout,
        t,
    )
    # views of the decomposition's arrays, not copies (one (step x rank) frame is 40 MB at 2,048
    # ranks x 2,500 steps)
    ratio = pd.DataFrame(
        parts.worker_ratio, index=compute.index, columns=compute.columns, copy=False
    )
    flagged = pd.DataFrame(
        parts.worker_flag, index=compute.index, columns=compute.columns, copy=False
    )
    return StepScores(
        compute,
        ratio,
        flagged,
        section_frames,
        layout,
        parts,
        step_s,
        start_ts,
        end_ts,
        {n: op for n, op in comm.items() if SECTION_PREFIX + n in columns},
        unknown_shares,
        sync,
        ends,
    )
