"""Issue 11, the engine's judgment, on real torch jobs (DDP over gloo under real torchrun agents,
one per simulated node, tests/torch_jobs/live_jobs.py) and their real store rows: each test is one
bullet of "What was seen".

The live engine's view at a moment T is rebuilt from the store as it was then: the segments that had
landed by T (their files appear by an atomic rename, so a segment's mtime is when a live reader
could first see it), judged at T. Moments are chosen from the data (never from how fast the machine
ran), so the tests do not depend on timing.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from faultlens.attribution.decision import Action, Restore, validate_document
from faultlens.attribution.engine import Engine, attribute, write_new_incidents
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, RestoreRequest, StoreHistory
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store
from faultlens.attribution.rules import load_thresholds

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
HASHED = (
    "tests/torch_jobs/train_live.py",
    "tests/torch_jobs/live_jobs.py",
    "collectors/training/step_timer.py",
    "collectors/training/timer_model.py",
    "collectors/training/timer_writer.py",
    "collectors/training/heartbeat.py",
    "collectors/store/schema.py",
    *sorted(
        str(p.relative_to(REPO)) for p in (REPO / "collectors/sources/process_events").glob("*.py")
    ),
    # the job specs are in this file
    "collectors/store/sink.py",
    "tests/test_live_judgment.py",
)


def _key() -> str:
    digest = hashlib.sha256()
    for name in HASHED:
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()[:16]


def _running_past_agent_death(heartbeat_step: Callable[[Any], int], step: int,
                               seconds: float) -> Callable[[list[Any]], bool]:
    """stop_at for the agent-loss run: node-1's workers past `step`, `seconds` after its agent was
    seen dead.
    """
    seen_dead: list[float] = []

    def stop(agents: list[Any]) -> bool:
        if agents[1].exit_code is None:
            return False
        if not seen_dead:
            seen_dead.append(time.monotonic())
        return heartbeat_step(agents[1]) >= step and time.monotonic() - seen_dead[0] >= seconds

    return stop


def _generate(root: Path) -> dict:
    """Two jobs at a time (each is a handful of processes that mostly wait), the two attempts of one
    job in order.
    """
    import concurrent.futures

    from tests.torch_jobs.live_jobs import heartbeat_step, kill_node_at, run_job

    fast = {"FAULTLENS_LIVE_STEP_S": "0.03"}
    jobs: dict[str, list[dict]] = {
        # a healthy job: flushes its step rows every 4 s, tears down for 3 s with no step open,
        # exits 0
        "healthy": [
            dict(
                attempt=0,
                scenario="healthy",
                nodes=["node-0", "node-1"],
                nproc=2,
                env={
                    "FAULTLENS_LIVE_STEPS": "150",
                    "FAULTLENS_LIVE_FLUSH_S": "4",
                    "FAULTLENS_LIVE_TEARDOWN_S": "3",
                    "FAULTLENS_LIVE_STEP_S": "0.05",
                },
            )
        ],
        # global rank 3 SIGSEGVs inside step 20 in every attempt; the second attempt runs it on
        # another node
        "sigsegv": [
            dict(
                attempt=attempt,
                scenario="sigsegv",
                nodes=nodes,
                nproc=2,
                env={
                    "FAULTLENS_LIVE_STEPS": "40",
                    "FAULTLENS_LIVE_AT": "20",
                    "FAULTLENS_LIVE_RANK": "3",
                    "FAULTLENS_LIVE_FLUSH_S": "2",
                    **fast,
                },
            )
            for attempt, nodes in ((0, ["node-0", "node-1"]), (1, ["node-0", "node-2"]))
        ],
        # loss NaN from step 12 on every rank
        "nan": [
            dict(
                attempt=0,
                scenario="nan",
                nodes=["node-0", "node-1"],
                nproc=2,
                env={"FAULTLENS_LIVE_STEPS": "20", "FAULTLENS_LIVE_AT": "12", **fast},
            )
        ],
        # node loss: node-1's agent and workers SIGKILLed together at step 15
        "nodeloss": [
            dict(
                attempt=0,
                scenario="healthy",
                nodes=["node-0", "node-1"],
                nproc=2,
                env={"FAULTLENS_LIVE_STEPS": "2000", **fast},
                kill=kill_node_at("node-1", 15),
            )
        ],
        # node loss in pieces: node-1's agent and its first worker SIGKILLed; its other worker
        # echoes the lost peer on its way down, and no agent is left to report how it ended
        "nodeloss-echo": [
            dict(
                attempt=0,
                scenario="healthy",
                nodes=["node-0", "node-1"],
                nproc=2,
                env={"FAULTLENS_LIVE_STEPS": "2000", **fast},
                kill=kill_node_at("node-1", 15, workers=1),
            )
        ],
        # agent loss: only node-1's agent is SIGKILLed at step 15; its workers train on until the
        # test supervisor stops the attempt (signal_sent rows first) once they reached step 40 and
        # ran 3 s past the agent's death as the runner saw it (25 steps of 0.03 s alone are under
        # the 1 s the rule looks past it, and under load the runner notices the death late)
        "agentloss": [
            dict(
                attempt=0,
                scenario="healthy",
                nodes=["node-0", "node-1"],
                nproc=2,
                env={"FAULTLENS_LIVE_STEPS": "2000", **fast},
                kill=kill_node_at("node-1", 15, agent_only=True),
                stop_at=_running_past_agent_death(heartbeat_step, step=40, seconds=3.0),
            )
        ],
    }

    def run(name: str) -> list[dict]:
        done = []
        for spec in jobs[name]:
            result = run_job(root / name / "store", root / name / "work", job_id=name, **spec)  # type: ignore[arg-type]
            done.append(
                {
                    "attempt": result.attempt,
                    "exit_codes": result.exit_codes,
                    "events": result.events,
                }
            )
        return done

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(run, name)
            for name in ("sigsegv", "healthy", "nodeloss", "nodeloss-echo", "agentloss", "nan")
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="session")
def live_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs above, generated once per code version ($FAULTLENS_LIVE_ARTIFACTS keeps them across
    sessions).
    """
    configured = os.environ.get("FAULTLENS_LIVE_ARTIFACTS")
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one generation for every xdist worker
        shared = shared.parent
    base = Path(configured) if configured else shared / "live-runs"
    base.mkdir(parents=True, exist_ok=True)
    root = base / _key()
    with open(base / f"{_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "COMPLETE").exists():
            if root.exists():
                shutil.rmtree(root)
            runs = _generate(root)
            (root / "runs.json").write_text(json.dumps(runs, indent=1))
            (root / "COMPLETE").write_text("ok")
    return root


def _thresholds(**progress: float):
    base = load_thresholds()
    return base.model_copy(update={"progress": base.progress.model_copy(update=progress)})


FAST = dict(floor_s=1.5, k=5.0, startup_floor_s=60.0, warmup_steps=3, min_baseline_steps=5)


def _view(store: Path, at: dt.datetime, out: Path) -> Path:
    """The store as a live reader saw it at `at`: the segments that had landed by then."""
    limit = at.timestamp() * 1e9
    for path in store.rglob("*.parquet"):
        if path.stat().st_mtime_ns <= limit:
            target = out / path.relative_to(store)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return out


def _judge(store: Path, at: dt.datetime, out: Path, engine: Engine) -> list:
    with Store(_view(store, at, out)) as view:
        telemetry = load_from_store(view)
        return engine.run(telemetry, at, at)


# ------------------------------------------------------------------ healthy runs raise nothing


def test_a_long_flush_interval_is_not_a_stall(live_runs: Path, tmp_path: Path) -> None:
    """Step rows land every 4 s, the floor is 1.5 s: at a moment when the newest visible step row is
    older than the floor plus a second while the heartbeats show the job stepping, no hang is raised
    (before: a hang)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    store = live_runs / "healthy" / "store"
    segments = [(dt.datetime.fromtimestamp(p.stat().st_mtime_ns / 1e9, dt.UTC),
                 pc.max(pq.read_table(p, columns=["end_ts"]).column("end_ts")).as_py())
                for p in (store / "steps").rglob("*.parquet")]
    with Store(store) as reader:
        last = reader.query("SELECT max(end_ts) AS t FROM steps").to_pylist()[0]["t"]
        beats = reader.query("SELECT ts, step_ts FROM heartbeats WHERE step_ts IS NOT NULL ORDER "
                             "BY ts").to_pylist()
    moments = []
    for beat in beats:  # candidate moments: just after a heartbeat showed a fresh step completion
        at = beat["ts"] + dt.timedelta(milliseconds=300)
        if at > last or at - beat["step_ts"] > dt.timedelta(milliseconds=600):
            continue
        visible = [end for landed, end in segments if landed <= at and end is not None]
        if visible and at - max(visible) >= dt.timedelta(seconds=FAST["floor_s"] + 1.0):
            moments.append(at)
    assert moments, (
        "the run never had stale step rows while stepping: it did not exercise the flush interval"
    )
    engine = Engine(thresholds=_thresholds(**FAST))
    for i, at in enumerate(moments[:: max(1, len(moments) // 3)][:3]):
        found = _judge(store, at, tmp_path / f"view-{i}", engine)
        assert not [f for f in found if f.incident_class == IncidentClass.COLLECTIVE_HANG], (
            at,
            found,
        )


def test_teardown_after_the_last_step_is_not_a_hang(live_runs: Path, tmp_path: Path) -> None:
    """Two seconds into a 3 s teardown (no rank inside a step, nobody exited yet) the job is not
    hung (before: a hang with no culprit); the finished job as a whole has no incident at all."""
    store = live_runs / "healthy" / "store"
    with Store(store) as reader:
        last = reader.query("SELECT max(end_ts) AS t FROM steps").to_pylist()[0]["t"]
        exits = reader.query(
            "SELECT min(ts) AS t FROM process_events WHERE kind = 'agent_exit'"
        ).to_pylist()[0]["t"]
    at = last + dt.timedelta(seconds=2.0)
    assert exits is None or exits > at
    found = _judge(store, at, tmp_path / "view", Engine(thresholds=_thresholds(**FAST)))
    assert found == []
    assert attribute(store, engine=Engine(thresholds=_thresholds(**FAST))) == []


# ------------------------------------------------------------------ a bug that follows the rank


def _decide_in_order(store: Path, incidents: list) -> list:
    """The policy's decisions, in order, each with the store's history as it was when it was made.
    """
    from faultlens.controller.delivery import Deliverer

    policy = DecisionPolicy(history=StoreHistory(Store(store)))
    deliverer = Deliverer(str(store), [])
    decisions = []
    for incident in sorted(incidents, key=lambda i: (i.attempt or 0, i.first_signal_ts)):
        write_new_incidents(str(store), [incident])
        decision = policy.decide(incident)
        deliverer.submit(decision)
        decisions.append(decision)
    return decisions


def test_a_signal_death_that_follows_the_rank_is_escalated_at_its_second_occurrence(
    live_runs: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    shutil.copytree(live_runs / "sigsegv" / "store", store)
    incidents = sorted(attribute(store), key=lambda i: i.attempt)
    crashes = [i for i in incidents if i.incident_class == IncidentClass.CRASH]
    assert [i.attempt for i in crashes] == [0, 1], incidents
    first, second = crashes
    assert first.culprit_ranks == (3,) and first.culprit_nodes == ("node-1",)
    assert first.step == second.step == 20  # the step it died in: last completed + 1
    assert first.fingerprint == second.fingerprint == "SIGSEGV@rank3"
    assert second.cause == Cause.SOFTWARE and second.culprit_nodes == ()
    decisions = _decide_in_order(store, crashes)
    assert decisions[0].action == Action.FAILOVER and decisions[0].exclude_nodes == ("node-1",)
    assert decisions[1].action == Action.ESCALATE  # never a second failover


# ------------------------------------------------------------------ node loss and agent loss


#: a node loss as CI once saw it: rank 3 of node-1 echoed rank 2's death between the two SIGKILLs
#: (README there)
ECHO_RACE = REPO / "tests" / "data" / "live-nodeloss-echo-race" / "store"
STEP_AFTER_ECHO = REPO / "tests" / "data" / "live-nodeloss-step-after-echo" / "store"
# CI stores kept unedited (their READMEs)
KEPT = {"echo-race": ECHO_RACE, "step-after-echo": STEP_AFTER_ECHO}
NODE_LOSSES = ["nodeloss", "nodeloss-echo", "echo-race", "step-after-echo"]


def _node_loss_store(live_runs: Path, name: str) -> Path:
    """The store of a node-1 loss: the live run `name`, or the CI store kept in tests/data; for the
    two with an echo, checked to hold one (a node-1 rank's comm_error), so the case is really
    exercised."""
    store = KEPT[name] if name in KEPT else live_runs / name / "store"
    if name != "nodeloss":
        with Store(store) as reader:
            echoes = reader.query(
                "SELECT count(*) AS n FROM process_events WHERE node = 'node-1' "
                "AND kind = 'comm_error' AND rank IS NOT NULL"
            ).to_pylist()[0]["n"]
        assert echoes, f"{name}: no rank of node-1 echoed its node-mate's loss"
    return store


@pytest.mark.parametrize("name", NODE_LOSSES)
def test_node_loss_is_a_host_crash_of_that_node(live_runs: Path, name: str) -> None:
    store = _node_loss_store(live_runs, name)
    incidents = attribute(store)
    assert len(incidents) == 1, incidents
    incident = incidents[0]
    assert (incident.incident_class, incident.cause) == (IncidentClass.CRASH, Cause.HOST)
    assert incident.culprit_nodes == ("node-1",) and incident.culprit_ranks == (2, 3)
    assert incident.confidence >= 0.85
    decision = DecisionPolicy().decide(incident)
    assert decision.action == Action.FAILOVER and decision.exclude_nodes == ("node-1",)


@pytest.mark.parametrize("name", NODE_LOSSES)
def test_node_loss_without_an_agent_report_still_names_the_node(live_runs: Path, name: str) -> None:
    """No supervisor rows at all (a cluster without one): every rank of node-1 fell silent (or only
    echoed its node-mate's loss and left no exit) while node-0's ranks lost contact."""
    with Store(_node_loss_store(live_runs, name)) as reader:
        telemetry = load_from_store(reader)
    events = telemetry.process_events
    telemetry.process_events = events[events["source"] != "supervisor"].reset_index(drop=True)
    now = dt.datetime.now(dt.UTC)
    incidents = Engine().run(telemetry, now, telemetry.as_of)
    assert [(i.cause, i.culprit_nodes, i.culprit_ranks) for i in incidents] == [
        (Cause.HOST, ("node-1",), (2, 3))
    ], incidents
    assert DecisionPolicy().decide(incidents[0]).action == Action.FAILOVER


def test_agent_loss_names_the_node_and_the_supervisors_teardown_is_no_crash(
    live_runs: Path,
) -> None:
    store = live_runs / "agentloss" / "store"
    incidents = attribute(store)
    assert len(incidents) == 1, incidents
    incident = incidents[0]
    assert incident.rule == "crash-agent-lost" and incident.culprit_nodes == ("node-1",)
    assert incident.cause == Cause.HOST
    assert DecisionPolicy().decide(incident).exclude_nodes == ("node-1",)


# ------------------------------------------------------------------ NaN loss


def test_nan_loss_is_data_corruption_restored_from_before_the_first_bad_step(
    live_runs: Path,
) -> None:
    incidents = attribute(live_runs / "nan" / "store")
    assert len(incidents) == 1, incidents
    incident = incidents[0]
    assert (incident.incident_class, incident.cause, incident.step) == (IncidentClass.NUMERICS,
                                                                        Cause.DATA_CORRUPTION, 12)
    assert incident.culprit_ranks == (0, 1, 2, 3) and incident.culprit_nodes == ()
    requests: list[RestoreRequest] = []

    def newest_before(request: RestoreRequest) -> Restore | None:
        requests.append(request)
        return (
            Restore("durable", 10)
            if request.before_step is not None and request.before_step > 10
            else None
        )

    decision = DecisionPolicy(restore_chooser=newest_before).decide(incident)
    # a rollback: no node left out, the newest checkpoint from before the first bad step
    assert decision.action == Action.FAILOVER and decision.exclude_nodes == ()
    assert requests and requests[0].before_step == 12 and decision.restore == Restore("durable", 10)
    validate_document(decision.to_document())
    # nothing to roll back to: a human, not a restart from scratch on the same state
    stuck = DecisionPolicy(restore_chooser=lambda request: None).decide(incident)
    assert stuck.action == Action.ESCALATE and "nothing-to-restore" in stuck.policy_rule
