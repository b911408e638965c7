"""Silent data corruption on real torch jobs (tests/numerics_jobs.py: the campaign's DDP script,
gloo on the CPU, deterministic seeds, the in-job numerics signals on, faults through the campaign's
injector): a flipped bit in one replica's parameters is found by its digest and named (rank, node),
the restore comes from before it and the resumed run's digests equal a fault-free run's; a gradient
bit flipped again and again on one rank names that rank, once it is an observation; a bad batch on
every rank that comes back is no incident; a spike that repeats is restarted in place without its
batches, and escalated when it comes back after the rollback.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.detectors.loss import LossMonitor
from faultlens.attribution.detectors.numerics import NumericsJudge
from faultlens.attribution.engine import Engine, attribute, utc_now
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, load_policy
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store
from faultlens.attribution.rules import load_thresholds
from faultlens.controller.lab.plan import FaultSpec
from faultlens.controller.report.data import job_data
from faultlens.controller.report.html import render_html
from faultlens.controller.restore import plan_restore, write_plan
from tests.numerics_jobs import catalog, injected, train

pytest.importorskip("torch")


def _digests(root: Path, attempt: int) -> dict[int, set[str]]:
    with Store(str(root / "store")) as store:
        rows = store.query(
            "SELECT step, digest FROM numerics WHERE digest IS NOT NULL AND attempt = ?", [attempt]
        ).to_pylist()
    found: dict[int, set[str]] = {}
    for row in rows:
        found.setdefault(row["step"], set()).add(row["digest"])
    return found


def _losses(root: Path, attempt: int) -> dict[int, float]:
    with Store(str(root / "store")) as store:
        rows = store.query(
            "SELECT step, loss FROM steps WHERE phase = 'train' AND rank = 0 AND attempt = ?",
            [attempt],
        ).to_pylist()
    return {r["step"]: r["loss"] for r in rows}


def _judged(root: Path) -> tuple[list, list]:
    """The numerics incidents (the attempts here run without a supervisor, so nothing records that
    an attempt's processes exited: the hang detector may suspect a finished attempt once the next
    one has run) and the observations."""
    with Store(str(root / "store")) as store:
        incidents = [i for i in attribute(store) if i.incident_class == IncidentClass.NUMERICS]
        judge = NumericsJudge(load_thresholds().loss)
        seen = judge.observations(load_from_store(store))
    return incidents, seen


def _shown(root: Path, job: str) -> list[tuple[str, int]]:
    """The observations the job's HTML report draws on its timeline (one marker each)."""
    with Store(str(root / "store")) as store:
        data = job_data(store, job)
    page = render_html(data)
    found = [(o["kind"], o["step"]) for o in data["observations"]]
    assert page.count('class="observation"') == len(found), page[:2000]
    assert all(o["text"].split(" (")[0] in html.unescape(page) for o in data["observations"])
    return found


def test_a_flipped_parameter_bit_names_its_replica_and_the_restore_is_certified(
    tmp_path: Path,
) -> None:
    nodes = ["node-0", "node-1", "node-2"]
    healthy = train(tmp_path / "healthy", "healthy", 3)
    # a mantissa bit of one weight of rank 1, after its optimizer step at step 9
    faults = (
        FaultSpec(
            id="param", kind="bitflip", step=9, rank=1, params={"target": "param", "bit": 22}
        ),
    )
    flipped = train(tmp_path / "flip", "flip", 3, faults)
    assert [(r["fault"], r["rank"], r["step"]) for r in injected(flipped)] == [("param", 1, 9)]

    clean = _digests(healthy, 0)
    assert sorted(clean) == [0, 4, 8, 12, 16, 20] and all(len(d) == 1 for d in clean.values())
    assert _judged(healthy) == ([], [])

    incidents, seen = _judged(flipped)
    assert seen == []
    # what the digests certify is the fault-free run's state
    assert {s: d for s, d in _digests(flipped, 0).items() if s <= 8} == {
        s: d for s, d in clean.items() if s <= 8
    }
    assert [(i.incident_class, i.cause, i.rule) for i in incidents] == [
        (IncidentClass.NUMERICS, Cause.DATA_CORRUPTION, "numerics-digest-mismatch")
    ], [i.summary for i in incidents]
    (incident,) = incidents
    # the odd one out of three replicas; between the last agreeing digest (8) and the mismatch (12)
    assert incident.culprit_ranks == (1,) and incident.culprit_nodes == ("node-1",)
    assert incident.step == 9 and incident.details["certified_step"] == 8
    assert "certified" in incident.evidence[0].text

    chooser = catalog(flipped, "flip", nodes)
    decision = DecisionPolicy(load_policy(), restore_chooser=chooser).decide(
        incident, job_nodes=nodes
    )
    assert decision.action is Action.FAILOVER and decision.exclude_nodes == ("node-1",)
    assert decision.restore is not None and decision.restore.step <= 8, decision.reason
    assert "the digests of every replica agree at step 8" in decision.reason
    plan = plan_restore(decision, chooser, world_size=3)
    assert plan is not None and plan.step == decision.restore.step
    write_plan(plan, tmp_path / "plan.json")

    # attempt 1 on a replacement node; the fault-free job restarted from the same step beside it
    train(
        flipped,
        "flip",
        3,
        attempt=1,
        nodes=["node-0", "node-3", "node-2"],
        plan=tmp_path / "plan.json",
    )
    own = plan_restore(
        dataclasses.replace(decision, exclude_nodes=()),
        catalog(healthy, "healthy", nodes),
        world_size=3,
    )
    assert own is not None and own.step == plan.step
    write_plan(own, tmp_path / "healthy-plan.json")
    train(healthy, "healthy", 3, attempt=1, plan=tmp_path / "healthy-plan.json")
    resumed = _digests(flipped, 1)
    assert sorted(resumed) == [s for s in sorted(clean) if s > plan.step]
    assert all(len(d) == 1 for d in resumed.values())
    # the same digests as the fault-free run restarted at that step (an uninterrupted run differs
    # in last bits: DDP rebuilds its gradient buckets after a start, which changes the order gloo
    # sums three replicas' gradients in), and the same losses bit for bit as the uninterrupted run
    assert resumed == _digests(healthy, 1)
    assert _losses(flipped, 1) == {s: v for s, v in _losses(healthy, 0).items() if s > plan.step}
    incidents, _ = _judged(flipped)
    assert [i.attempt for i in incidents] == [0]


def test_a_gradient_bit_flipped_again_and_again_names_its_rank(tmp_path: Path) -> None:
    faults = (
        FaultSpec(
            id="again",
            kind="bitflip",
            step=10,
            until_step=13,
            rank=1,
            params={"target": "grad", "bit": 30, "param": 2},
        ),
        FaultSpec(
            id="once",
            kind="bitflip",
            step=5,
            rank=0,
            params={"target": "grad", "bit": 30, "param": 2},
        ),
    )
    root = train(tmp_path, "grads", 2, faults)
    assert {(r["fault"], r["rank"]) for r in injected(root)} == {("again", 1), ("once", 0)}
    incidents, seen = _judged(root)
    assert [(i.rule, i.culprit_ranks, i.culprit_nodes, i.step) for i in incidents] == [
        ("numerics-grad-outlier", (1,), ("node-1",), 10)
    ], [i.summary for i in incidents]
    assert [(o.kind, o.ranks, o.step) for o in seen] == [("grad_outlier", (0,), 5)]
    assert _shown(root, "grads") == [("grad_outlier", 5)]
    decision = DecisionPolicy(
        load_policy(), restore_chooser=catalog(root, "grads", ["node-0", "node-1"])
    ).decide(incidents[0], job_nodes=["node-0", "node-1"])
    assert decision.action is Action.FAILOVER and decision.exclude_nodes == ("node-1",)
    assert decision.restore is not None and decision.restore.step < 10


def test_a_bad_batch_on_every_rank_that_comes_back_is_an_observation(tmp_path: Path) -> None:
    root = train(
        tmp_path,
        "batch",
        1,
        (FaultSpec(id="batch", kind="loss_spike", step=14, params={"factor": 1000}),),
    )
    assert [r["step"] for r in injected(root)] == [14]
    incidents, seen = _judged(root)
    assert incidents == []
    assert [(o.kind, o.step, o.ranks) for o in seen] == [("loss_spike_recovered", 14, ())]
    # shown on the job's timeline in its report, no incident
    assert _shown(root, "batch") == [("loss_spike_recovered", 14)]


def test_a_spike_that_repeats_restarts_in_place_without_its_batches_then_escalates(
    tmp_path: Path,
) -> None:
    # the same two bad batches in every attempt (a deterministic data shard)
    faults = tuple(
        FaultSpec(
            id=f"batch-{s}", kind="loss_spike", step=s, attempts=None, params={"factor": 1000}
        )
        for s in (14, 18)
    )
    root = train(tmp_path, "shard", 1, faults)
    incidents, _ = _judged(root)
    assert [(i.rule, i.step, i.culprit_ranks) for i in incidents] == [
        ("numerics-spike-repeat", 14, ())
    ], [i.summary for i in incidents]
    chooser = catalog(root, "shard", ["node-0"])
    decision = DecisionPolicy(load_policy(), restore_chooser=chooser).decide(
        incidents[0], job_nodes=["node-0"]
    )
    assert decision.action is Action.RESTART and decision.exclude_nodes == ()
    assert decision.restore is not None and decision.restore.step < 14
    assert decision.restore.skip_steps == (14, 18)
    plan = plan_restore(decision, chooser, world_size=1)
    assert plan is not None and plan.skip_steps == (14, 18)
    write_plan(plan, tmp_path / "plan-1.json")

    # the script leaves the two batches out: no spike, no incident in attempt 1
    train(root, "shard", 1, faults, attempt=1, plan=tmp_path / "plan-1.json")
    assert not [r for r in injected(root) if r["attempt"] == 1]
    incidents, _ = _judged(root)
    assert [i.attempt for i in incidents] == [0]

    # a script that replays them: the spike of step 14 again, recognised across attempts
    write_plan(dataclasses.replace(plan, skip_steps=()), tmp_path / "plan-2.json")
    train(root, "shard", 1, faults, attempt=2, plan=tmp_path / "plan-2.json")
    incidents, _ = _judged(root)
    again = [i for i in incidents if i.attempt == 2]
    assert [(i.rule, i.step) for i in again] == [("numerics-spike-repeats", 14)]
    decision = DecisionPolicy(load_policy(), restore_chooser=chooser).decide(
        again[0], job_nodes=["node-0"]
    )
    assert decision.action is Action.ESCALATE, decision.reason


def test_a_flipped_activation_bit_names_the_rank_where_the_nan_began(tmp_path: Path) -> None:
    # the top exponent bit of one output of one rank's forward (x 2^128: its loss is not finite,
    # the all_reduce spreads it to every replica); a mantissa bit earlier changes nothing visible
    faults = (
        FaultSpec(
            id="benign",
            kind="bitflip",
            step=5,
            rank=0,
            params={"target": "activation", "bit": 22, "layer": 0, "index": 11},
        ),
        FaultSpec(
            id="act",
            kind="bitflip",
            step=9,
            rank=1,
            params={"target": "activation", "bit": 30, "layer": -1, "index": 3},
        ),
    )
    root = train(tmp_path, "act", 2, faults)
    assert [(r["fault"], r["rank"], r["step"]) for r in injected(root)] == [
        ("benign", 0, 5),
        ("act", 1, 9),
    ]
    incidents, _ = _judged(root)
    assert [(i.rule, i.culprit_ranks, i.culprit_nodes, i.step) for i in incidents] == [
        ("numerics-nonfinite-origin", (1,), (), 9)
    ], [i.summary for i in incidents]
    assert incidents[0].culprit_gpus == ("node-1:gpu0",)
    nodes = ["node-0", "node-1"]
    decision = DecisionPolicy(
        load_policy(), restore_chooser=catalog(root, "act", nodes)
    ).decide(incidents[0], job_nodes=nodes)
    # one event is no verdict on the node: a restart in place from before it
    assert decision.action is Action.RESTART and decision.exclude_nodes == ()
    assert decision.restore is not None and decision.restore.step < 9, decision.reason

    # live, the heartbeats (or the step rows) carry the every-rank NaN before the probe's rows of
    # step 9 arrive: a poll that sees it with the probe's rows only up to step 8 holds it for them
    # (at most nonfinite_settle_s), then decides it as it is; with them, the origin is named
    with Store(str(root / "store")) as store:
        telemetry = load_from_store(store)
    numerics = telemetry.numerics
    engine = Engine(detectors=["crash", "loss"])
    settle = load_thresholds().loss.nonfinite_settle_s
    every_rank = LossMonitor(load_thresholds().loss).attribute(telemetry, utc_now())
    assert [(i.culprit_ranks, i.step) for i in every_rank] == [((0, 1), 9)]
    first = every_rank[0].first_signal_ts
    for upto in (0, 5, 9):
        early = dataclasses.replace(telemetry, numerics=numerics[numerics["step"] < upto])
        at = first + dt.timedelta(seconds=settle / 2)
        held = engine.run(early, at, hangs=False)
        if upto == 0:  # no probe rows yet at all: nothing to wait for, decided at once
            assert [i.rule for i in held] == ["numerics-nonfinite-loss"]
            continue
        assert held == [], [i.summary for i in held]
        late = engine.run(early, first + dt.timedelta(seconds=settle + 1), hangs=False)
        assert [(i.rule, i.culprit_ranks) for i in late] == [("numerics-nonfinite-loss", (0, 1))]
    # only the rank where it began has reported step 9 (its first non-finite row is flushed at
    # once; its peer's finite one comes with the next flush): still held
    partial = numerics[(numerics["step"] < 9) | (numerics["rank"] == 1)]
    at = first + dt.timedelta(seconds=settle / 2)
    assert engine.run(dataclasses.replace(telemetry, numerics=partial), at, hangs=False) == []
    found = engine.run(telemetry, at, hangs=False)
    assert [(i.rule, i.culprit_ranks) for i in found] == [("numerics-nonfinite-origin", (1,))]
