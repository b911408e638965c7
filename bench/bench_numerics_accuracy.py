"""Silent data corruption on real DDP jobs: detection, localization and the restore per injected
corruption type, and false incidents on healthy look-alikes.

    PYTHONPATH=. python -m bench.bench_numerics_accuracy [--seeds 2] [--jobs 2] [--work DIR]
        [--only WORD,...] [--resumed-seeds N] [--write]

Every run is a real job (tests/numerics_jobs.py: the campaign's DDP script over gloo on the CPU,
2 or 3 ranks, one a node, 24 steps, a digest and a checkpoint every 4 steps, the in-job numerics
signals on), its faults injected by the campaign's injector the way hardware does it (one flipped
bit in a parameter after the optimizer step, in a gradient before the all_reduce, in an activation
of one forward; a bad batch). Each run is judged by the batch pass (the engine's numerics
incidents) and decided by the policy with the run's own checkpoints:

- detected, rank exact (the flipped rank and only it; "job-wide" where the type cannot be
  localized), the rule and the action;
- flip to incident: the batch pass replayed over the rows as they were at each step after the
  flip; the first step whose rows give the attempt's incident, in steps and in seconds from the
  injection to that step's last row (add the sink's flush interval, 0.5 s here, and a follower's
  poll for the live delay);
- the restore step against the flip (before it in every case), and the resumed job (attempt 1 on
  the plan, a spare in place of an excluded node): its incidents, and its parameter digests
  against the fault-free run of the same seed restarted from the same step (equal: the restore is
  the state the job would have had);
- the healthy look-alikes (seeds, batch sizes, 2 and 3 ranks, a learning-rate warm-up to a high
  peak, a learning-rate change, a bad batch on every rank once, a gradient flip once, a slower
  rank, the resumed jobs): their numerics incidents, all false.

Results go to <work>/results.jsonl as they come (a rerun with the same --work skips what is done);
`--write` puts one table per corruption type into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Figure, Section, emit, machine, write_section

PREFIX = "Silent data corruption"
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
COMMAND = (
    "PYTHONPATH=. python -m bench.bench_numerics_accuracy --seeds 3 --resumed-seeds 1 --jobs 2 "
    "--work DIR"
)
WRITE = "PYTHONPATH=. python -m bench.bench_numerics_accuracy --no-run --work DIR --write"


@dataclass(frozen=True)
class Case:
    """One kind of run: a row of its family's table."""

    family: str  # parameter, gradient, activation, bad batch, healthy
    name: str
    world: int
    faults: Callable[[int], tuple[Any, ...]] = lambda k: ()
    args: Callable[[int], tuple[str, ...]] = lambda k: ()
    expect: str = "rank"  # rank: the flipped rank named; job: job-wide; none: no incident
    seeds: int | None = None  # None: --seeds
    # the resumed attempt replays the batches the plan says to skip (a script that does not read
    # skip_steps): the spike must be recognised across attempts and escalated
    replay: bool = False

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in f"{self.family}-{self.name}")[:60]


def _flip(target: str, rank: int, step: int, bit: int, until: int | None = None, **params: Any):
    from faultlens.controller.lab.plan import FaultSpec

    return FaultSpec(
        id="flip",
        kind="bitflip",
        step=step,
        rank=rank,
        until_step=until,
        params={"target": target, "bit": bit, "index": 7 * step + 3, **params},
    )


def _spike(step: int, factor: float, attempts: Any = (0,)):
    from faultlens.controller.lab.plan import FaultSpec

    return FaultSpec(
        id=f"batch-{step}",
        kind="loss_spike",
        step=step,
        attempts=attempts,
        params={"factor": factor},
    )


def _slow(rank: int, step: int, extra_s: float):
    from faultlens.controller.lab.plan import FaultSpec

    return FaultSpec(
        id="slow",
        kind="slow",
        step=step,
        rank=rank,
        params={"section": "forward", "extra_s": extra_s},
    )


def cases() -> list[Case]:
    return [
        Case(
            "parameter", "mantissa bit 22, once", 3, lambda k: (_flip("param", k % 3, 6 + k, 22),)
        ),
        Case(
            "parameter",
            "exponent bit 26, once",
            3,
            lambda k: (_flip("param", (k + 1) % 3, 7 + k, 26, param=2),),
        ),
        Case(
            "parameter",
            "exponent bit 30 (x2^128), once",
            3,
            lambda k: (_flip("param", (k + 2) % 3, 9 + k, 30),),
        ),
        Case(
            "gradient",
            "exponent bit 30, 3 steps in a row",
            2,
            lambda k: (_flip("grad", k % 2, 8 + k, 30, 11 + k, param=2),),
        ),
        Case(
            "gradient",
            "exponent bit 30, 3 steps in a row, 3 ranks",
            3,
            lambda k: (_flip("grad", (k + 1) % 3, 10 + k, 30, 13 + k, param=0),),
        ),
        Case(
            "activation",
            "exponent bit 30 (x2^128) in the output layer, once",
            2,
            lambda k: (_flip("activation", k % 2, 9 + k, 30, layer=-1),),
        ),
        Case(
            "activation",
            "exponent bit 30 in the output layer, once, 3 ranks",
            3,
            lambda k: (_flip("activation", (k + 2) % 3, 11 + k, 30, layer=-1),),
        ),
        Case(
            "activation",
            "mantissa bit 22, once (benign: no incident is right)",
            2,
            lambda k: (_flip("activation", k % 2, 9 + k, 22, layer=0),),
            expect="none",
        ),
        Case(
            "bad batch",
            "the same two bad batches in every attempt (a data shard)",
            2,
            lambda k: (_spike(14 + k, 1000.0, None), _spike(18 + k, 300.0, None)),
            expect="job",
        ),
        Case(
            "bad batch",
            "the same two bad batches, replayed after the rollback (skip_steps not read)",
            2,
            lambda k: (_spike(13 + k, 800.0, None), _spike(17 + k, 400.0, None)),
            expect="job",
            replay=True,
        ),
        Case("healthy", "fault-free (seeds, batch sizes, 2 ranks)", 2, expect="none", seeds=4),
        Case("healthy", "fault-free (seeds, batch sizes, 3 ranks)", 3, expect="none", seeds=2),
        Case(
            "healthy",
            "learning-rate warm-up to a high peak",
            2,
            args=lambda k: ("--lr", str(0.03 * (k + 1)), "--warmup-steps", str(12 + 2 * k)),
            expect="none",
            seeds=2,
        ),
        Case(
            "healthy",
            "learning-rate change (x30 at a step)",
            2,
            args=lambda k: ("--lr-change", f"{12 + k}:0.03"),
            expect="none",
            seeds=2,
        ),
        Case(
            "healthy",
            "bad batch on every rank once (back to normal)",
            2,
            lambda k: (_spike(10 + k, 100.0 * (k + 1)),),
            expect="none",
            seeds=2,
        ),
        Case(
            "healthy",
            "one gradient bit flip once (an observation)",
            2,
            lambda k: (_flip("grad", k % 2, 8 + k, 30, param=2),),
            expect="none",
            seeds=2,
        ),
        Case(
            "healthy",
            "one rank slower from a step (step-time change)",
            2,
            lambda k: (_slow(k % 2, 8 + k, 0.05),),
            expect="none",
            seeds=2,
        ),
    ]


# --------------------------------------------------------------------------- one run


def _config(case: Case, k: int) -> dict:
    # a loaded machine: a rank may wait long for its peers (gloo's timeout), the run for its ranks
    return {
        "seed": k,
        "batch": 16 + 8 * k,
        "args": (*case.args(k), "--timeout", "600"),
        "timeout_s": 1800,
    }


def _numerics(store_dir: Path, attempt: int) -> list:
    from faultlens.attribution.engine import attribute
    from faultlens.attribution.reading.store import Store

    with Store(str(store_dir)) as store:  # no supervisor: see tests/test_numerics_jobs.py
        return [
            i
            for i in attribute(store)
            if i.incident_class.value == "numerics" and i.attempt == attempt
        ]


def _digests(store_dir: Path, attempt: int) -> dict[int, list[str]]:
    from faultlens.attribution.reading.store import Store

    with Store(str(store_dir)) as store:
        rows = store.query(
            "SELECT step, digest FROM numerics WHERE digest IS NOT NULL AND attempt = ?", [attempt]
        ).to_pylist()
    found: dict[int, set[str]] = {}
    for row in rows:
        found.setdefault(int(row["step"]), set()).add(row["digest"])
    return {s: sorted(d) for s, d in sorted(found.items())}


def first_detection(store_dir: Path, attempt: int, from_step: int) -> tuple[int, float] | None:
    """(step, ts) of the first step at or after `from_step` whose rows, with everything before
    them, give the attempt a numerics incident in the batch pass's loss detector."""
    import pandas as pd

    from faultlens.attribution.detectors.builtin import first_per_attempt
    from faultlens.attribution.detectors.loss import LossMonitor
    from faultlens.attribution.detectors.numerics import NumericsJudge
    from faultlens.attribution.reading.store import Store
    from faultlens.attribution.reading.telemetry import load_from_store
    from faultlens.attribution.rules import load_thresholds

    thresholds = load_thresholds().loss
    monitor, judge = LossMonitor(thresholds), NumericsJudge(thresholds)
    with Store(str(store_dir)) as store:
        telemetry = load_from_store(store)

    def upto(frame: pd.DataFrame, step: int) -> pd.DataFrame:
        if frame.empty or "step" not in frame.columns:
            return frame
        keep = (frame["attempt"] < attempt) | (
            (frame["attempt"] == attempt) & (frame["step"] <= step)
        )
        return frame[keep].reset_index(drop=True)

    steps = sorted(
        {int(s) for s in telemetry.numerics["step"] if s >= from_step}
        | {int(s) for s in telemetry.steps["step"].dropna() if s >= from_step}
    )
    now = dt.datetime.now(dt.UTC)
    for step in steps:
        seen = dataclasses.replace(
            telemetry,
            steps=upto(telemetry.steps, step),
            numerics=upto(telemetry.numerics, step),
        )
        found = [
            i
            for i in first_per_attempt(monitor.attribute(seen, now) + judge.attribute(seen, now))
            if i.attempt == attempt
        ]
        if found:
            rows = telemetry.numerics
            at = rows[(rows["attempt"] == attempt) & (rows["step"] == step)]["ts"]
            ts = pd.Timestamp(at.max()).timestamp() if len(at) else float("nan")
            return step, ts
    return None


class Runner:
    """The runs of one bench invocation, their results kept in <work>/results.jsonl."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.path = work / "results.jsonl"
        self.done: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                row = json.loads(line)
                self.done[row["id"]] = row
        self.lock = threading.Lock()
        self.twins: dict[str, threading.Lock] = {}

    def save(self, row: dict) -> dict:
        with self.lock:
            self.done[row["id"]] = row
            with self.path.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        emit("numerics-accuracy", row)
        return row

    # a fault-free run of a seed and world: the healthy row, and the base of the comparisons
    def base(self, world: int, k: int) -> Path:
        root = self.work / f"base-w{world}-s{k}"
        with self.lock:
            lock = self.twins.setdefault(root.name, threading.Lock())
        with lock:
            if not (root / "done").exists():
                from tests.numerics_jobs import train

                shutil.rmtree(root, ignore_errors=True)
                config = _config(Case("healthy", "fault-free", world), k)
                train(root, f"job{k}", world, (), **config)
                (root / "done").write_text("")
        return root

    def first(self, case: Case, k: int) -> dict:
        from tests.numerics_jobs import train

        rid = f"{case.slug}/{k}"
        if rid in self.done:
            return self.done[rid]
        plain = case.family == "healthy" and case.name.startswith("fault-free")
        faults = case.faults(k)
        if plain:
            root = self.base(case.world, k)
        else:
            root = self.work / case.slug / str(k)
            shutil.rmtree(root, ignore_errors=True)
            train(root, f"job{k}", case.world, faults, **_config(case, k))
        return self.save(self.judge(case, k, root))

    def judge(self, case: Case, k: int, root: Path) -> dict:
        """The row of a run that has finished under `root` (attempt 0)."""
        from tests.numerics_jobs import injected

        rid = f"{case.slug}/{k}"
        faults = case.faults(k)
        found = _numerics(root / "store", 0)
        shot = [r for r in injected(root) if r["attempt"] == 0]
        row: dict[str, Any] = {
            "id": rid,
            "family": case.family,
            "case": case.name,
            "seed": k,
            "world": case.world,
            "expect": case.expect,
            "root": str(root),
            "incidents": [(i.rule, list(i.culprit_ranks)) for i in found],
            "injected": [(r["fault"], r["rank"], r["step"]) for r in shot],
            "fault_rank": next((f.rank for f in faults if f.kind == "bitflip"), None),
            "fault_step": min((f.step for f in faults), default=None),
        }
        if found and case.expect != "none":
            row.update(self._decide(case, k, root, found[0], shot))
        return row

    def _decide(self, case: Case, k: int, root: Path, incident: Any, shot: list) -> dict:
        from faultlens.attribution.policy import DecisionPolicy, load_policy
        from faultlens.controller.restore import plan_restore, write_plan
        from tests.numerics_jobs import catalog

        nodes = [f"node-{r}" for r in range(case.world)]
        chooser = catalog(root, f"job{k}", nodes)
        decision = DecisionPolicy(load_policy(), restore_chooser=chooser).decide(
            incident, job_nodes=nodes
        )
        fault_step = min(f.step for f in case.faults(k))
        detected = first_detection(root / "store", 0, fault_step)
        out: dict[str, Any] = {
            "rule": incident.rule,
            "ranks": list(incident.culprit_ranks),
            "action": decision.action.value,
            "excluded": list(decision.exclude_nodes),
            "restore": decision.restore.step if decision.restore else None,
            "skip_steps": list(decision.restore.skip_steps) if decision.restore else [],
            "reason": decision.reason,
            "detect_step": detected[0] if detected else None,
            "detect_s": detected[1] - shot[0]["ts"] if detected and shot else None,
        }
        plan = plan_restore(decision, chooser, world_size=case.world)
        if plan is not None and plan.step is not None:
            write_plan(plan, root / "plan.json")
            out["plan"] = str(root / "plan.json")
            out["decision"] = {
                "exclude": list(decision.exclude_nodes),
                "step": plan.step,
                "skip": list(plan.skip_steps),
            }
            out["decision_json"] = decision.to_json()
        return out

    def resumed(self, case: Case, k: int, first: dict) -> dict | None:
        """Attempt 1 of a decided run on its plan, and the fault-free run of its seed restarted
        from the same step beside it: incidents, and the digests compared."""
        from tests.numerics_jobs import train

        rid = f"{first['id']}/resumed"
        if rid in self.done:
            return self.done[rid]
        if not first.get("plan"):
            return None
        root = Path(first["root"])
        info = first["decision"]
        nodes = [f"node-{r}" for r in range(case.world)]
        spare = [n if n not in info["exclude"] else f"spare-{n}" for n in nodes]
        plan = Path(first["plan"])
        if case.replay:
            plan = self._without_skip(plan)
        train(
            root,
            f"job{k}",
            case.world,
            case.faults(k),
            attempt=1,
            nodes=spare,
            plan=plan,
            **_config(case, k),
        )
        after = _numerics(root / "store", 1)
        if case.replay:
            return self.save(self._replayed(case, k, rid, root, after))
        # the fault-free run of the same seed, restarted from the same step (a copy of the base)
        base = self.base(case.world, k)
        # one twin per seed, world, restore step and skipped steps (cases share it)
        skip = "-".join(map(str, info["skip"]))
        twin = self.work / "fault-free" / f"w{case.world}-s{k}-r{info['step']}-k{skip}"
        with self.lock:
            lock = self.twins.setdefault(twin.name, threading.Lock())
        with lock:
            return self._twin(case, k, rid, first, root, after, twin, base)

    @staticmethod
    def _without_skip(plan: Path) -> Path:
        data = json.loads(plan.read_text())
        data["skip_steps"] = []
        out = plan.with_name("plan-replayed.json")
        out.write_text(json.dumps(data))
        return out

    def _replayed(self, case: Case, k: int, rid: str, root: Path, after: list) -> dict:
        """Attempt 1 that re-fed the skipped batches: its incident and the policy's decision."""
        from faultlens.attribution.policy import DecisionPolicy, load_policy
        from tests.numerics_jobs import catalog

        nodes = [f"node-{r}" for r in range(case.world)]
        decided = (
            DecisionPolicy(
                load_policy(), restore_chooser=catalog(root, f"job{k}", nodes)
            ).decide(after[0], job_nodes=nodes)
            if after
            else None
        )
        return {
            "id": rid,
            "family": case.family,
            "case": case.name,
            "seed": k,
            "incidents": [(i.rule, list(i.culprit_ranks)) for i in after],
            "replayed": True,
            "replay_rule": after[0].rule if after else None,
            "replay_step": after[0].step if after else None,
            "replay_action": decided.action.value if decided else None,
            "twin": False,
            "twin_incidents": [],
            "digests_equal": None,
        }

    def _twin(
        self,
        case: Case,
        k: int,
        rid: str,
        first: dict,
        root: Path,
        after: list,
        twin: Path,
        base: Path,
    ) -> dict:
        from faultlens.attribution.decision import Decision
        from faultlens.controller.restore import plan_restore, write_plan
        from tests.numerics_jobs import catalog, train

        nodes = [f"node-{r}" for r in range(case.world)]
        ran = False
        if not (twin / "store").exists() or not _digests(twin / "store", 1):
            shutil.rmtree(twin, ignore_errors=True)
            shutil.copytree(base, twin)
            decision = Decision.from_json(first["decision_json"])
            own = plan_restore(
                dataclasses.replace(decision, exclude_nodes=()),
                catalog(twin, f"job{k}", nodes),
                world_size=case.world,
            )
            if own is not None and own.step == first["decision"]["step"]:
                write_plan(own, twin / "plan.json")
                train(
                    twin,
                    f"job{k}",
                    case.world,
                    (),
                    attempt=1,
                    plan=twin / "plan.json",
                    **_config(case, k),
                )
                ran = True
        theirs = _digests(twin / "store", 1) if (twin / "store").exists() else {}
        mine = _digests(root / "store", 1)
        equal = (
            bool(mine) and mine == theirs and all(len(d) == 1 for d in mine.values())
            if theirs
            else None  # the twin has no checkpoint at that step: no comparison
        )
        return self.save(
            {
                "id": rid,
                "family": case.family,
                "case": case.name,
                "seed": k,
                "incidents": [(i.rule, list(i.culprit_ranks)) for i in after],
                # a twin shared by several cases is counted once, with the case that ran it
                "twin_incidents": [
                    (i.rule, list(i.culprit_ranks)) for i in _numerics(twin / "store", 1)
                ]
                if ran
                else [],
                "twin": ran,
                "digests_equal": equal,
                "resumed_digests": {str(s): d for s, d in mine.items()},
            }
        )


# --------------------------------------------------------------------------- tables


def _span(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _fault_figure(name: str, rows: list[dict], resumed: list[dict], commit: str, date: str):
    expect = rows[0]["expect"]
    if expect == "none":  # a benign flip: any incident is wrong
        false = sum(len(r["incidents"]) for r in rows)
        return Figure(name, f"{false} incidents in {len(rows)} runs", "0", commit=commit, date=date)
    hits = [r for r in rows if r.get("rule")]
    if expect == "rank":
        exact = sum(1 for r in hits if r["ranks"] == [r["fault_rank"]])
        where = f"rank exact {exact}/{len(rows)}"
    else:
        exact = sum(1 for r in hits if r["ranks"] == [])
        where = f"job-wide {exact}/{len(rows)}"
    before = sum(1 for r in hits if r["restore"] is not None and r["restore"] < r["fault_step"])
    steps = [r["detect_step"] - r["fault_step"] for r in hits if r.get("detect_step") is not None]
    secs = [r["detect_s"] for r in hits if r.get("detect_s") is not None]
    later = sum(len(r["incidents"]) for r in resumed)
    equal = sum(1 for r in resumed if r["digests_equal"])
    outcome = sorted({f"{r['rule']} -> {r['action']}" for r in hits})
    skips = sorted({tuple(r.get("skip_steps") or ()) != () for r in hits})
    replays = [r for r in resumed if r.get("replayed")]
    if replays:
        again = sum(1 for r in replays if r["replay_rule"] == "numerics-spike-repeats")
        up = sum(1 for r in replays if r["replay_action"] == "escalate")
        after = (
            f"replayed after the rollback: recognised across attempts {again}/{len(replays)}, "
            f"escalated {up}/{len(replays)}; "
        )
    elif resumed:
        after = f"resumed: {later} incidents, digests = fault-free {equal}/{len(resumed)}; "
    else:
        after = "resumed: not run; "
    value = (
        f"detected {len(hits)}/{len(rows)}, {where}; flip to incident {_span(steps, '{:d}')} "
        f"steps, {_span(secs, '{:.1f}')} s; restore before the flip {before}/{len(hits)}; "
        + (
            f"skip_steps in the plan {sum(1 for r in hits if r.get('skip_steps'))}/{len(hits)}; "
            if expect == "job" and skips
            else ""
        )
        + after
        + "; ".join(outcome)
    )
    return Figure(
        name,
        value,
        "all detected, exact, restore before, resumed equal",
        commit=commit,
        date=date,
    )


def sections(results: list[dict], commit: str, date: str, load: str) -> list[Section]:
    firsts = [r for r in results if not r["id"].endswith("/resumed")]
    resumes = {r["id"][: -len("/resumed")]: r for r in results if r["id"].endswith("/resumed")}
    notes = (
        "Real DDP jobs over gloo on the CPU (tests/numerics_jobs.py: 24 steps, a digest and a "
        "checkpoint every 4 steps), one rank a node; seeds, batch sizes, ranks, steps, elements "
        "and layers vary per run. Flip to incident: the batch pass replayed over the rows as "
        "they stood after each step; the seconds run from the injection to the last row of the "
        "step that completes the evidence (add the 0.5 s flush and a follower's poll for the live "
        "delay). Resumed: attempt 1 on the decision's plan (a spare in place of an excluded "
        "node), its digests against the fault-free run of the same seed restarted from the same "
        f"step. {load}",
    )
    faulty = sum(1 for r in firsts if r["family"] != "healthy")
    notes = (
        *notes,
        f"{len(firsts)} first attempts judged ({faulty} with a corruption injected, "
        f"{len(firsts) - faulty} healthy), {len(resumes)} resumed: a case of the bench that is "
        "not in these tables did not run.",
    )
    out = []
    families = ("parameter", "gradient", "activation", "bad batch")
    titles = {
        "parameter": "one flipped bit in one replica's parameters (after its optimizer step)",
        "gradient": "a flipped bit in one rank's gradient before the all_reduce",
        "activation": "a flipped bit in an activation of one rank's forward",
        "bad batch": "a bad batch that repeats (a loss spike in every attempt)",
    }
    for family in families:
        mine = [r for r in firsts if r["family"] == family]
        if not mine:
            continue
        by_case: dict[str, list[dict]] = {}
        for r in mine:
            by_case.setdefault(r["case"], []).append(r)
        figures = [
            _fault_figure(
                name, rows, [resumes[r["id"]] for r in rows if r["id"] in resumes], commit, date
            )
            for name, rows in by_case.items()
        ]
        out.append(
            Section(
                f"{PREFIX}: {titles[family]}",
                "faultlens numerics signals, detector and policy per injected type (no peer tool "
                "names the rank of a silent corruption: the anchor is the truth injected).",
                (COMMAND, WRITE),
                tuple(figures),
                notes,
            )
        )
    healthy = [r for r in firsts if r["family"] == "healthy"]
    figures = []
    by_case = {}
    for r in healthy:
        by_case.setdefault(r["case"], []).append(r)
    for name, rows in by_case.items():
        false = sum(len(r["incidents"]) for r in rows)
        figures.append(
            Figure(
                name, f"{false} false incidents in {len(rows)} runs", "0", commit=commit, date=date
            )
        )
    # a replay of the skipped batches is a fault case's evidence, not a healthy run
    resumed = [r for r in resumes.values() if not r.get("replayed")]
    for label, key in (
        ("resumed after the rollback (the faulty jobs' attempt 1)", "incidents"),
        ("fault-free runs restarted from the rollback's step", "twin_incidents"),
    ):
        rows = [r for r in resumed if key == "incidents" or r["twin"]]
        if not rows:
            continue
        false = sum(len(r[key]) for r in rows)
        figures.append(
            Figure(
                label, f"{false} false incidents in {len(rows)} runs", "0", commit=commit, date=date
            )
        )
    total = len(healthy) + len(resumed) + sum(1 for r in resumed if r["twin"])
    false = sum(len(r["incidents"]) for r in healthy) + sum(
        len(r["incidents"]) + len(r["twin_incidents"]) for r in resumed
    )
    figures.append(
        Figure(
            "all healthy runs",
            f"{false} false incidents in {total} runs",
            "0",
            commit=commit,
            date=date,
        )
    )
    if healthy:
        out.append(
            Section(
                f"{PREFIX}: healthy look-alikes",
                "faultlens numerics detector on healthy runs that look like a corruption "
                "(numerics incidents counted; none is right).",
                (COMMAND, WRITE),
                tuple(figures),
                notes,
            )
        )
    return out


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:
        return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=2, help="runs per case, at least")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--work", default="", help="keep the runs and results here (resumable)")
    parser.add_argument("--only", default="", help="cases whose name holds one of these words")
    parser.add_argument(
        "--resumed-seeds",
        type=int,
        default=None,
        help="resume (and compare with the fault-free twin) only the first N seeds of a case "
        "(default: all; a case that replays its skipped batches is always resumed)",
    )
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--load", default="", help="the machine's load, for the notes")
    parser.add_argument(
        "--no-run", action="store_true", help="run nothing: --write what <work> holds"
    )
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="numerics-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(work)
    words = tuple(w for w in args.only.split(",") if w)
    chosen = [c for c in cases() if not words or any(w in f"{c.family} {c.name}" for w in words)]
    # every case's first seed before any case's second: a run cut short still covers every case
    todo = sorted(
        ((c, k) for c in chosen for k in range(max(c.seeds or 0, args.seeds))),
        key=lambda ck: ck[1],
    )
    if args.no_run:
        todo = []
    start = time.time()

    def run(case: Case, k: int) -> None:
        try:
            first = runner.first(case, k)
            if case.replay or args.resumed_seeds is None or k < args.resumed_seeds:
                runner.resumed(case, k, first)
        except Exception as exc:  # one failed run is reported, the others go on
            print(f"{case.slug}/{k}: {type(exc).__name__}: {str(exc)[-2000:]}", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(lambda ck: run(*ck), todo))
    print(f"{len(runner.done)} results in {work} ({time.time() - start:.0f} s)")
    if args.write:
        load = args.load or f"Machine: {machine()['cpu']}, {machine()['cores']} cores, shared."
        date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
        for section in sections(list(runner.done.values()), _commit(), date, load):
            write_section(DOC, section)


if __name__ == "__main__":
    main()
