"""The NaN/Inf half of the numerics detector: a loss that is not finite is an incident of class
`numerics`, cause `data_corruption` (docs/design.md "Numerics"), so the restore picks the newest
complete checkpoint from before the first bad step. Spikes, gradient-norm outliers and parameter
digests are attribution/detectors/numerics.py's.

The loss comes from the step rows (StepTimer records `step.loss`; the `loss_nonfinite` column of the
steps frame keeps NaN apart from "no loss given") and from the heartbeats, which carry the first
step whose loss was not finite as soon as the step ends, whatever the flush interval. One incident
per attempt: the first bad step. The culprit ranks are those whose loss went bad at the first bad
step; loss alone cannot tell a corrupt GPU from a corrupt batch, so no node is named.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pandas as pd

from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Telemetry
from faultlens.attribution.rules import LossThresholds


@dataclass(frozen=True)
class BadLoss:
    step: int
    ts: dt.datetime
    ranks: tuple[int, ...]
    kind: str  # "nonfinite" or "spike"
    text: str
    table: str


class LossMonitor:
    """Finds the first bad step of every attempt."""

    def __init__(self, thresholds: LossThresholds) -> None:
        self.t = thresholds

    def attribute(self, telemetry: Telemetry, now: dt.datetime) -> list[Incident]:
        steps, beats = telemetry.steps, telemetry.heartbeats
        found = []
        keys: set[tuple[str, int | None]] = set()
        for frame in (steps, beats):
            if frame.empty:
                continue
            for job, attempt in (
                frame[["job_id", "attempt"]].drop_duplicates().itertuples(index=False)
            ):
                if job is None or job is pd.NA:
                    continue
                keys.add((str(job), None if attempt is None or attempt is pd.NA else int(attempt)))
        for job, attempt in sorted(keys, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
            rows = _pick(steps, job, attempt)
            bad = _first_nonfinite(rows, _pick(beats, job, attempt))
            if bad is not None:
                found.append(self._incident(job, attempt, bad, rows, now))
        return found

    def _incident(self, job: str, attempt: int | None, bad: BadLoss, rows: pd.DataFrame,
                  now: dt.datetime) -> Incident:
        all_ranks = sorted(int(r) for r in rows["rank"].dropna().unique()) if not rows.empty else []
        spread = "every rank" if all_ranks and set(bad.ranks) >= set(all_ranks) else (
            f"ranks {list(bad.ranks)}" if bad.ranks else "some ranks")
        rule = "numerics-nonfinite-loss" if bad.kind == "nonfinite" else "numerics-loss-spike"
        confidence = 0.95 if bad.kind == "nonfinite" else 0.75
        summary = (f"numerics: {'NaN/Inf loss' if bad.kind == 'nonfinite' else 'loss spike'} from "
                   f"step {bad.step} "
                   f"on {spread}; cause data_corruption: restore from before step {bad.step}")
        return Incident(
            incident_id=Incident.make_id("numerics", job, attempt, bad.step),
            incident_class=IncidentClass.NUMERICS,
            cause=Cause.DATA_CORRUPTION,
            first_signal_ts=bad.ts,
            detected_ts=now,
            confidence=confidence,
            rule=rule,
            summary=summary,
            job_id=job,
            attempt=attempt,
            culprit_ranks=bad.ranks,
            evidence=(Evidence(bad.table, bad.ts, bad.text),),
            step=bad.step,
            details={"kind": bad.kind},
        )


def _pick(frame: pd.DataFrame, job: str, attempt: int | None) -> pd.DataFrame:
    if frame.empty:
        return frame
    rows = frame[frame["job_id"] == job]
    if attempt is not None:
        rows = rows[rows["attempt"] == attempt]
    return rows


def _nonfinite(rows: pd.DataFrame) -> pd.Series:
    if "loss_nonfinite" in rows.columns:
        return rows["loss_nonfinite"].fillna(False).astype(bool)
    return pd.Series(False, index=rows.index)


def _done(rows: pd.DataFrame) -> pd.Series:
    if "end_ts" in rows.columns:
        return rows["end_ts"].where(rows["end_ts"].notna(), rows["ts"])
    return rows["ts"]


def _first_nonfinite(rows: pd.DataFrame, beats: pd.DataFrame) -> BadLoss | None:
    candidates: list[BadLoss] = []
    if not rows.empty:
        bad = rows[_nonfinite(rows)]
        if not bad.empty:
            step = int(bad["step"].min())
            at = bad[bad["step"] == step]
            ranks = tuple(sorted(int(r) for r in at["rank"].dropna().unique()))
            ts = as_datetime(_done(at).min())
            candidates.append(BadLoss(step, ts, ranks, "nonfinite",
                                      f"loss is NaN/Inf at step {step} on {len(ranks)} rank(s) "
                                      f"{list(ranks)}",
                                      "steps"))
    if not beats.empty and "bad_loss_step" in beats.columns:
        bad = beats[beats["bad_loss_step"].notna()]
        if not bad.empty:
            step = int(bad["bad_loss_step"].min())
            at = bad[bad["bad_loss_step"] == step]
            ranks = tuple(sorted(int(r) for r in at["rank"].dropna().unique()))
            ts = as_datetime(at["ts"].min())
            candidates.append(BadLoss(step, ts, ranks, "nonfinite",
                                      f"heartbeat: loss went NaN/Inf at step {step} on rank(s) "
                                      f"{list(ranks)}",
                                      "heartbeats"))
    if not candidates:
        return None
    step = min(c.step for c in candidates)
    chosen = [c for c in candidates if c.step == step]
    ranks = tuple(sorted({r for c in chosen for r in c.ranks}))
    first = min(chosen, key=lambda c: c.ts or dt.datetime.max.replace(tzinfo=dt.UTC))
    return BadLoss(step, first.ts, ranks, "nonfinite", first.text, first.table)
