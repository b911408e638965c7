"""Silent data corruption and loss spikes, judged against the job's own history (docs/design.md
"Numerics"). Four signals, each an incident of class `numerics`, cause `data_corruption`:

- a replica whose parameter digest differs (the `numerics` table's digest column, written every N
  steps after the optimizer step): data-parallel replicas of one (tp, pp) shard must hold identical
  parameters. The odd one out of three or more is named (rank, node, GPU); of two, the one whose
  gradient norm was an outlier since the last agreeing digest, else neither ("job-wide"). The
  restore is certified: from before the first step after the last digest all replicas agreed on.
- a rank whose local gradient norm (before the all_reduce) is an outlier among its data-parallel
  peers on `outlier_steps` steps of the attempt: a corruption that persists, on that rank. One such
  step is an observation (one bad batch on one rank looks the same).
- a loss spike (the step's mean loss over its ranks >= spike_factor x the median of the previous
  window_steps steps, earlier attempts' steps before it counted too: a resumed run is judged from
  its first step) that does not come back within recover_steps steps: a divergence. A spike that
  comes back is an observation, unless it repeats in the attempt, or an earlier attempt spiked at
  the same step (the same batch): a data-dependent spike. A spike never names a rank: it is
  job-wide, a restart in place from before it, leaving out the spike's batches (`skip_steps`);
  one recognised across attempts is escalated (the data or the learning rate, not hardware).

`observations()` lists what was seen but is no incident (recovered spikes, one-step outliers).
`awaits_origin()` holds a NaN/Inf loss on every rank (loss.py; the heartbeats carry it at once)
while the probe's rows of its step are not in yet, at most nonfinite_settle_s: they say where it
began.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Telemetry
from faultlens.attribution.rules import LossThresholds

Key = tuple[str, int]


@dataclass(frozen=True)
class Observation:
    """A numerics signal that is no incident (shown, never decided on)."""

    job_id: str
    attempt: int
    step: int
    kind: str  # loss_spike_recovered, grad_outlier
    ranks: tuple[int, ...]
    text: str
    ts: dt.datetime | None = None  # when the step's evidence was written


@dataclass(frozen=True)
class Spike:
    step: int
    value: float
    median: float
    recovered: bool | None  # None: not enough steps after it yet
    ts: dt.datetime | None


class NumericsJudge:
    """The numerics incidents and observations of a job's telemetry (steps and numerics rows)."""

    def __init__(self, thresholds: LossThresholds) -> None:
        self.t = thresholds

    def attribute(self, telemetry: Telemetry, now: dt.datetime) -> list[Incident]:
        return self._judge(telemetry, now)[0]

    def observations(self, telemetry: Telemetry) -> list[Observation]:
        return self._judge(telemetry, dt.datetime.now(dt.UTC))[1]

    def observations_of(self, steps: pd.DataFrame, numerics: pd.DataFrame) -> list[Observation]:
        """The observations of a job's step rows (a loss per step: one row per rank, or their
        mean) and numerics rows, without the rest of its telemetry (the job report)."""
        return self._judge_frames(steps, numerics, dt.datetime.now(dt.UTC))[1]

    def awaits_origin(self, incident: Incident, telemetry: Telemetry, now: dt.datetime) -> bool:
        """Whether a NaN/Inf loss on several ranks (loss.py's incident) waits for the numerics rows
        of its step: the attempt runs the probe (it has rows), a rank it names has none that far
        yet, and its first signal is under nonfinite_settle_s old. The all_reduce spreads one
        rank's NaN to every rank in the step it began, so only the probe's own losses tell."""
        if (
            incident.rule != "numerics-nonfinite-loss"
            or len(incident.culprit_ranks) < 2
            or incident.step is None
            or (now - incident.first_signal_ts).total_seconds() >= self.t.nonfinite_settle_s
        ):
            return False
        rows = _train(telemetry.numerics)
        if rows.empty:
            return False
        mine = rows[(rows["job_id"] == incident.job_id) & (rows["attempt"] == incident.attempt)]
        if mine.empty:  # no probe in this attempt: nothing to wait for
            return False
        reached = {int(r): int(s) for r, s in mine.groupby("rank")["step"].max().items()}
        return any(reached.get(int(r), -1) < incident.step for r in incident.culprit_ranks)

    # ------------------------------------------------------------------ per attempt
    def _judge(
        self, telemetry: Telemetry, now: dt.datetime
    ) -> tuple[list[Incident], list[Observation]]:
        return self._judge_frames(telemetry.steps, telemetry.numerics, now)

    def _judge_frames(
        self, step_rows: pd.DataFrame, numerics: pd.DataFrame, now: dt.datetime
    ) -> tuple[list[Incident], list[Observation]]:
        incidents: list[Incident] = []
        seen: list[Observation] = []
        rows = _train(numerics)
        steps = _train(step_rows)
        series = _loss_series(steps, rows)
        for key in sorted(set(series) | set(_keys(rows))):
            job, attempt = key
            mine = (
                rows[(rows["job_id"] == job) & (rows["attempt"] == attempt)]
                if not rows.empty
                else rows
            )
            found = [
                i
                for i in (
                    self._digests(key, mine, now),
                    self._outliers(key, mine, now, seen),
                    self._nonfinite_origin(key, mine, now),
                )
                if i is not None
            ]
            spike = self._spikes(key, series, mine, now, seen)
            if spike is not None:
                found.append(spike)
            if found:  # the first bad signal; a localized one before a job-wide one at a tie
                incidents.append(
                    min(found, key=lambda i: (i.step, not i.culprit_nodes, not i.culprit_ranks))
                )
        return incidents, seen

    def _digests(self, key: Key, rows: pd.DataFrame, now: dt.datetime) -> Incident | None:
        if rows.empty or "digest" not in rows.columns:
            return None
        digests = rows[rows["digest"].notna()]
        if digests.empty:
            return None
        last_agree: int | None = None
        for step, at in digests.groupby("step", sort=True):
            groups = (
                [g for _, g in at.groupby(_peer_columns(at), dropna=False)]
                if _peer_columns(at)
                else [at]
            )
            bad = [g for g in groups if g["digest"].nunique() > 1]
            if not bad:
                last_agree = int(step)
                continue
            culprits: list[int] = []
            lines = []
            for group in bad:
                counts = Counter(group["digest"])
                top, top_n = counts.most_common(1)[0]
                if top_n * 2 > len(group) and top_n >= 2:
                    odd = group[group["digest"] != top]
                    culprits += [int(r) for r in odd["rank"].dropna()]
                    lines.append(
                        f"{top_n} of {len(group)} replicas agree, rank(s) "
                        f"{sorted(int(r) for r in odd['rank'].dropna())} differ"
                    )
                else:
                    suspect = self._outlier_since(rows, group, last_agree, int(step))
                    culprits += suspect
                    lines.append(
                        f"replicas {sorted(int(r) for r in group['rank'].dropna())} "
                        "disagree"
                        + (
                            f"; rank {suspect} had the gradient-norm outlier"
                            if suspect
                            else ": no majority, job-wide"
                        )
                    )
            first = last_agree + 1 if last_agree is not None else 0
            certified = (
                f"certified: the digests of every replica agree at step {last_agree}"
                if last_agree is not None
                else "no digest agreed before it"
            )
            text = f"parameter digests differ at step {int(step)} ({'; '.join(lines)}); {certified}"
            ts = as_datetime(at["ts"].min())
            if not culprits:  # no replica to blame: restart in place from the certified state
                base: dict[str, object] = {"restart_in_place": True}
            else:
                base = {}
            return self._incident(
                key,
                "numerics-digest-mismatch",
                first,
                ts,
                now,
                sorted(set(culprits)),
                rows,
                text,
                0.9,
                {
                    **base,
                    "kind": "digest_mismatch",
                    "certified_step": last_agree,
                    "mismatch_step": int(step),
                    "checks": certified,
                },
            )
        return None

    def _nonfinite_origin(self, key: Key, rows: pd.DataFrame, now: dt.datetime) -> Incident | None:
        """The first step where a rank's own loss is not finite, when that is one rank while its
        peers' are finite: where the NaN/Inf began (a gradient norm alone can overflow while every
        gradient is finite: an outlier, see _outliers). Named by rank and GPU; one event
        is no verdict on the node (no node named: a restart in place from before it)."""
        if rows.empty or "loss" not in rows.columns:
            return None
        loss = pd.to_numeric(rows["loss"], errors="coerce").to_numpy(dtype=float, na_value=0.0)
        bad = rows[~np.isfinite(loss)]
        if bad.empty:
            return None
        step = int(bad["step"].min())
        at = rows[rows["step"] == step]
        ranks = sorted({int(r) for r in bad[bad["step"] == step]["rank"].dropna()})
        if len(ranks) != 1 or len(at) < 2:
            return None
        _, gpus = _placement(rows, ranks)
        text = (
            f"rank {ranks[0]}'s own loss is not finite at step {step} while its "
            f"{len(at) - 1} peer(s)' are finite: the NaN/Inf began there"
        )
        incident = self._incident(
            key,
            "numerics-nonfinite-origin",
            step,
            as_datetime(at["ts"].min()),
            now,
            ranks,
            rows,
            text,
            0.9,
            {"kind": "nonfinite_origin", "restart_in_place": True},
        )
        return dataclasses.replace(incident, culprit_nodes=(), culprit_gpus=tuple(gpus))

    def _outlier_since(
        self, rows: pd.DataFrame, group: pd.DataFrame, after: int | None, upto: int
    ) -> list[int]:
        ranks = {int(r) for r in group["rank"].dropna()}
        found = _outlier_steps(rows, self.t.grad_outlier_factor)
        hits = {r for (s, r) in found if r in ranks and (after is None or s > after) and s <= upto}
        return sorted(hits) if len(hits) == 1 else []

    def _outliers(
        self, key: Key, rows: pd.DataFrame, now: dt.datetime, seen: list[Observation]
    ) -> Incident | None:
        found = _outlier_steps(rows, self.t.grad_outlier_factor)
        if not found:
            return None
        by_rank: dict[int, list[int]] = {}
        for step, rank in sorted(found):
            by_rank.setdefault(rank, []).append(step)
        persistent = {r: s for r, s in by_rank.items() if len(s) >= self.t.outlier_steps}
        for rank, steps in by_rank.items():
            if rank not in persistent:
                seen.extend(
                    Observation(
                        key[0],
                        key[1],
                        s,
                        "grad_outlier",
                        (rank,),
                        f"rank {rank}'s local gradient norm is an outlier among "
                        f"its data-parallel peers at step {s} (once)",
                        as_datetime(rows[rows["step"] == s]["ts"].max()),
                    )
                    for s in steps
                )
        if not persistent:
            return None
        first = min(s[0] for s in persistent.values())
        ranks = sorted(persistent)
        at = rows[rows["step"] == first]
        detail = ", ".join(f"rank {r} at steps {s[:5]}" for r, s in sorted(persistent.items()))
        text = (
            f"local gradient norm an outlier among the data-parallel peers on "
            f">= {self.t.outlier_steps} steps: {detail}"
        )
        return self._incident(
            key,
            "numerics-grad-outlier",
            first,
            as_datetime(at["ts"].min()),
            now,
            ranks,
            rows,
            text,
            0.85,
            {"kind": "grad_outlier"},
        )

    def _spikes(
        self,
        key: Key,
        series: dict[Key, pd.Series],
        rows: pd.DataFrame,
        now: dt.datetime,
        seen: list[Observation],
    ) -> Incident | None:
        t = self.t
        if t.spike_factor is None or key not in series:
            return None
        spikes = self._find_spikes(key, series)
        if not spikes:
            return None
        earlier = {
            s.step
            for k, _ in series.items()
            if k[0] == key[0] and k[1] < key[1]
            for s in self._find_spikes(k, series)
        }
        job, attempt = key
        base = {"restart_in_place": True}
        for i, spike in enumerate(spikes):
            if spike.step in earlier:
                text = (
                    f"loss spiked to {spike.value:.4g} at step {spike.step} "
                    f"({spike.value / spike.median:.1f}x the median) as it did at that step in "
                    "an earlier attempt: the same batch spikes again (data or learning rate)"
                )
                return self._incident(
                    key,
                    "numerics-spike-repeats",
                    spike.step,
                    spike.ts,
                    now,
                    [],
                    rows,
                    text,
                    0.8,
                    {
                        **base,
                        "kind": "spike_repeat_across_attempts",
                        "skip_steps": [spike.step],
                        "escalate": "the same spike came back after a rollback",
                    },
                )
            if spike.recovered is False:
                text = (
                    f"loss spiked to {spike.value:.4g} at step {spike.step} "
                    f"({spike.value / spike.median:.1f}x the median {spike.median:.4g}) and "
                    f"did not come back within {t.recover_steps} steps: divergence"
                )
                return self._incident(
                    key,
                    "numerics-loss-divergence",
                    spike.step,
                    spike.ts,
                    now,
                    [],
                    rows,
                    text,
                    0.8,
                    {**base, "kind": "divergence", "skip_steps": [spike.step]},
                )
            if spike.recovered is None:
                return None  # no verdict yet
            if i >= 1:
                first = spikes[0]
                steps = [s.step for s in spikes[: i + 1]]
                text = (
                    f"loss spiked at steps {steps} of attempt {attempt} (each back to normal "
                    "after): a repeating spike"
                )
                return self._incident(
                    key,
                    "numerics-spike-repeat",
                    first.step,
                    first.ts,
                    now,
                    [],
                    rows,
                    text,
                    0.75,
                    {**base, "kind": "spike_repeat", "skip_steps": steps},
                )
            seen.append(
                Observation(
                    job,
                    attempt,
                    spike.step,
                    "loss_spike_recovered",
                    (),
                    f"loss spiked to {spike.value:.4g} at step {spike.step} "
                    f"({spike.value / spike.median:.1f}x the median) and came "
                    "back: an observation",
                    spike.ts,
                )
            )
        return None

    def _find_spikes(self, key: Key, series: dict[Key, pd.Series]) -> list[Spike]:
        t = self.t
        own = series[key]
        before = [s for k, s in series.items() if k[0] == key[0] and k[1] < key[1]]
        values = own.to_numpy(dtype=float)
        steps = own.index.to_numpy()
        found: list[Spike] = []
        spiked: set[int] = set()
        for i in range(len(values)):
            step = int(steps[i])
            mine = [
                values[j]
                for j in range(max(0, i - t.window_steps), i)
                if int(steps[j]) not in spiked
            ]
            if len(mine) < t.window_steps:  # a resumed run: the steps before it, newest attempt
                older: dict[int, float] = {}
                for s in before:
                    older.update({int(k): float(v) for k, v in s.items() if int(k) < step})
                fill = [
                    older[k] for k in sorted(older) if k < (int(steps[0]) if len(steps) else step)
                ]
                mine = (fill + mine)[-t.window_steps :]
            if len(mine) < t.min_history_steps:
                continue
            median = float(np.median(mine))
            if not (median > 0 and values[i] >= t.spike_factor * median):
                continue
            spiked.add(step)
            after = values[i + 1 : i + 1 + t.recover_steps]
            back = bool(np.any(after < t.recover_factor * median))
            recovered: bool | None = (
                True if back else (False if len(after) >= t.recover_steps else None)
            )
            found.append(
                Spike(step, float(values[i]), median, recovered, own.attrs.get("ts", {}).get(step))
            )
        return found

    def _incident(
        self,
        key: Key,
        rule: str,
        step: int,
        ts: dt.datetime | None,
        now: dt.datetime,
        ranks: list[int],
        rows: pd.DataFrame,
        text: str,
        confidence: float,
        details: dict[str, object],
    ) -> Incident:
        job, attempt = key
        nodes, gpus = _placement(rows, ranks)
        where = (
            f"rank(s) {ranks} on {', '.join(nodes) or 'an unknown node'}" if ranks else "job-wide"
        )
        summary = f"numerics ({details['kind']}) from step {step}, {where}: {text}"
        return Incident(
            incident_id=Incident.make_id("numerics", job, attempt, rule, step),
            incident_class=IncidentClass.NUMERICS,
            cause=Cause.DATA_CORRUPTION,
            first_signal_ts=ts or now,
            detected_ts=now,
            confidence=confidence,
            rule=rule,
            summary=summary,
            job_id=job,
            attempt=attempt,
            culprit_nodes=tuple(nodes),
            culprit_ranks=tuple(ranks),
            culprit_gpus=tuple(gpus),
            evidence=(
                Evidence("numerics" if rows is not None and not rows.empty else "steps", ts, text),
            ),
            step=step,
            details=details,
        )


# ---------------------------------------------------------------------- helpers


def _train(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "phase" not in frame.columns:
        return frame
    rows = frame[(frame["phase"] == "train") | frame["phase"].isna()]
    return rows[rows["job_id"].notna() & rows["attempt"].notna()]


def _keys(rows: pd.DataFrame) -> list[Key]:
    if rows.empty:
        return []
    pairs = rows[["job_id", "attempt"]].drop_duplicates().itertuples(index=False)
    return [(str(j), int(a)) for j, a in pairs]


def _loss_series(steps: pd.DataFrame, rows: pd.DataFrame) -> dict[Key, pd.Series]:
    """(job, attempt) -> the step's mean finite loss over its ranks, by step: the step rows, else
    (earlier attempts outside the window, a job that reports its loss only through the probe) the
    numerics rows."""
    out: dict[Key, pd.Series] = {}
    for frame in (steps, rows):
        if frame.empty or "loss" not in frame.columns:
            continue
        loss = pd.to_numeric(frame["loss"], errors="coerce")
        ok = frame[np.isfinite(loss.to_numpy(dtype=float, na_value=np.nan))]
        for (job, attempt), part in ok.groupby(["job_id", "attempt"]):
            key = (str(job), int(attempt))
            if key in out:
                continue
            means = part.groupby("step")["loss"].mean().sort_index()
            ends = part.groupby("step")["ts"].max()
            means.attrs["ts"] = {int(s): as_datetime(v) for s, v in ends.items()}
            out[key] = means
    return out


def _peer_columns(rows: pd.DataFrame) -> list[str]:
    """The columns that make data-parallel peers (the same shard): tp and pp rank where known."""
    return [c for c in ("tp_rank", "pp_rank") if c in rows.columns and rows[c].notna().any()]


def _outlier_steps(rows: pd.DataFrame, factor: float) -> set[tuple[int, int]]:
    """(step, rank) where the rank's local gradient norm is >= factor x its peers' median, or not
    finite while theirs are."""
    if rows.empty or "grad_norm" not in rows.columns:
        return set()
    norms = rows[rows["grad_norm"].notna()]
    found: set[tuple[int, int]] = set()
    peers = _peer_columns(norms)
    for _, group in norms.groupby(["step", *peers], dropna=False):
        if len(group) < 2:
            continue
        values = group["grad_norm"].to_numpy(dtype=float)
        ranks = group["rank"].to_numpy()
        finite = np.isfinite(values)
        for i in range(len(values)):
            others = np.delete(values, i)
            others = others[np.isfinite(others)]
            if len(others) == 0 or ranks[i] is pd.NA:
                continue
            median = float(np.median(others))
            if not finite[i] or (median > 0 and values[i] >= factor * median):
                found.add((int(group["step"].iloc[i]), int(ranks[i])))
    return found


def _placement(rows: pd.DataFrame, ranks: list[int]) -> tuple[list[str], list[str]]:
    if not ranks or rows.empty:
        return [], []
    mine = rows[rows["rank"].isin(ranks)]
    nodes = sorted({str(n) for n in mine["node"].dropna()}) if "node" in mine.columns else []
    gpus: set[str] = set()
    for _, row in mine.drop_duplicates("rank").iterrows():
        uuid, index = row.get("gpu_uuid"), row.get("gpu_index")
        if isinstance(uuid, str) and uuid:
            gpus.add(uuid)
        elif index is not None and index is not pd.NA and not pd.isna(index):
            gpus.add(f"{row.get('node')}:gpu{int(index)}")
    return nodes, sorted(gpus)


__all__ = ["NumericsJudge", "Observation"]
