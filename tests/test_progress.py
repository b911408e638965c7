"""Hang detection from progress (steps) and from collective-timeout reports, then the dump request
and the hang analysis of the dump set, mapped to nodes and GPUs."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from faultlens.attribution.detectors.progress import ProgressMonitor
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import Telemetry, load_from_store
from faultlens.attribution.rules import load_thresholds
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from tests.engine_rows import at, event, ingest_torch_artifacts, ranks_rows, steps_rows, write


def flat(rank: int, step: int) -> dict[str, float]:
    return {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}


@pytest.fixture
def monitor() -> ProgressMonitor:
    return ProgressMonitor(load_thresholds().progress)


def telemetry_of(store_dir: Path) -> Telemetry:
    with Store(str(store_dir)) as store:
        return load_from_store(store)


def training(store_dir: Path, steps: range, *, phase=None, attempt: int = 0, start: float = 0.0,
             sections=flat, step_gap: float = 0.0) -> float:
    """Writes 8 ranks x steps (1.01 s each + step_gap); returns when the last one completed (seconds
    from T0).
    """
    rows = steps_rows(
        "job-1",
        attempt,
        8,
        4,
        steps,
        start=start,
        sections=sections,
        phase=phase,
        step_gap=step_gap,
    )
    write(store_dir, "ranks", ranks_rows("job-1", attempt, 8, 4, start=start))
    write(store_dir, "steps", rows)
    return max(r["end_ts"] for r in rows).timestamp() - at(0).timestamp()


def test_stall_longer_than_k_times_recent_step_time_is_a_suspect(
    store_dir: Path, monitor: ProgressMonitor
) -> None:
    # 1.01 s steps with 10 s of data loading between them: recent step time ~11 s, threshold 5 x 11
    # = 55 s
    last = training(store_dir, range(50), step_gap=10.0)
    telemetry = telemetry_of(store_dir)

    assert monitor.suspects(telemetry, at(last + 40)) == []
    (suspect,) = monitor.suspects(telemetry, at(last + 70))

    assert suspect.job_id == "job-1" and suspect.attempt == 0
    assert suspect.last_step == 49
    assert suspect.since == at(last)
    assert 54 < suspect.threshold_s < 57
    assert "8 of 8 ranks finished step 49" in suspect.evidence[0].text


def test_floor_keeps_fast_jobs_from_alarming_on_short_pauses(
    store_dir: Path, monitor: ProgressMonitor
) -> None:
    last = training(store_dir, range(50))  # 1 s steps: 5 x 1 s = 5 s, but the floor is 10 s

    assert monitor.suspects(telemetry_of(store_dir), at(last + 8)) == []
    assert len(monitor.suspects(telemetry_of(store_dir), at(last + 11))) == 1


def test_warm_up_without_a_baseline_uses_the_startup_floor(
    store_dir: Path, monitor: ProgressMonitor
) -> None:
    def slow_start(rank: int, step: int) -> dict[str, float]:
        # compilation and autotuning in the first steps
        return {"forward": 90.0 if step < 2 else 0.3}

    last = training(store_dir, range(3), sections=slow_start)

    assert monitor.suspects(telemetry_of(store_dir), at(last + 300)) == []
    assert len(monitor.suspects(telemetry_of(store_dir), at(last + 601))) == 1


def test_warm_up_steps_stay_out_of_the_baseline(store_dir: Path, monitor: ProgressMonitor) -> None:
    def slow_start(rank: int, step: int) -> dict[str, float]:
        return {"forward": 200.0 if step < 3 else 1.0}

    last = training(store_dir, range(30), sections=slow_start)
    baseline = monitor.baseline(telemetry_of(store_dir).steps)

    assert baseline.baseline_s == pytest.approx(1.01, abs=0.01)
    assert monitor.suspects(telemetry_of(store_dir), at(last + 35)) != []


def test_periodic_evaluation_is_allowed_when_it_is_due(
    store_dir: Path, monitor: ProgressMonitor
) -> None:
    def sections(rank: int, step: int) -> dict[str, float]:
        return {"forward": 60.0} if step % 20 == 19 else flat(rank, step)

    # evaluation runs after every 20th step (steps 19, 39, 59 are eval and take 60 s)
    last = training(store_dir, range(59), sections=sections,
                    phase=lambda step: "eval" if step % 20 == 19 else "train")
    (suspect_check,) = [monitor.baseline(telemetry_of(store_dir).steps)]

    # step 59 (evaluation) is due next: a 90 s pause is fine, 2 x 60 s = 120 s is the allowance
    assert "eval steps take up to" in suspect_check.reason
    assert monitor.suspects(telemetry_of(store_dir), at(last + 90)) == []
    assert len(monitor.suspects(telemetry_of(store_dir), at(last + 125))) == 1


def test_evaluation_not_due_does_not_widen_the_allowance(
    store_dir: Path, monitor: ProgressMonitor
) -> None:
    def sections(rank: int, step: int) -> dict[str, float]:
        return {"forward": 60.0} if step % 20 == 19 else flat(rank, step)

    last = training(store_dir, range(45), sections=sections,
                    phase=lambda step: "eval" if step % 20 == 19 else "train")

    assert len(monitor.suspects(telemetry_of(store_dir), at(last + 40))) == 1


def test_a_checkpoint_seen_once_may_come_at_any_step(
    store_dir: Path, monitor: ProgressMonitor
) -> None:
    def sections(rank: int, step: int) -> dict[str, float]:
        return {"checkpoint": 100.0} if step == 10 else flat(rank, step)

    last = training(store_dir, range(30), sections=sections,
                    phase=lambda step: "checkpoint" if step == 10 else "train")

    assert monitor.suspects(telemetry_of(store_dir), at(last + 150)) == []
    assert len(monitor.suspects(telemetry_of(store_dir), at(last + 201))) == 1


def test_a_finished_job_is_not_hung(store_dir: Path, monitor: ProgressMonitor) -> None:
    last = training(store_dir, range(20))
    write(store_dir, "process_events", [event("exit", r, last + 1, exit_code=0) for r in range(8)])

    assert monitor.suspects(telemetry_of(store_dir), at(last + 3600)) == []


def test_an_earlier_attempt_that_stalled_before_the_restart_is_a_suspect(
    store_dir: Path, monitor: ProgressMonitor
) -> None:
    last = training(store_dir, range(20), attempt=0)
    # restarted 300 s after progress stopped
    training(store_dir, range(20, 40), attempt=1, start=last + 300)

    # attempt 1 is still running
    suspects = monitor.suspects(telemetry_of(store_dir), at(last + 330))

    assert [(s.attempt, s.last_step) for s in suspects] == [(0, 19)]


# ---------------------------------------------------------------- real torchrun hangs (interface 6)


def _meta(artifact: Path) -> dict:
    return json.loads((artifact / "meta.json").read_text())


def hangs(store_dir: Path, engine: Engine, now=None) -> list:
    return [i for i in attribute(str(store_dir), engine=engine, now=now)
            if i.incident_class == IncidentClass.COLLECTIVE_HANG]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def test_real_gloo_timeouts_trigger_the_hang_analysis_of_the_live_dumps(
    torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine
) -> None:
    artifact = torch_artifacts["hang"]
    meta = _meta(artifact)
    ingest_torch_artifacts(artifact, store_dir, dumps="dumps", job=meta["run_id"])

    found = attribute(str(store_dir), engine=engine)

    # timeouts everywhere: no crash
    assert [i.incident_class for i in found] == [IncidentClass.COLLECTIVE_HANG]
    (incident,) = found
    assert incident.culprit_ranks == tuple(meta["culprit_ranks"])
    assert incident.culprit_nodes == (meta["node"],)  # through the ranks table of the step timer
    assert incident.details["verdict"] == meta["expected"]["verdict"].lower()
    assert incident.details["pg"] == meta["expected"]["pg_desc"]
    assert incident.details["op"] == meta["expected"]["op"]
    assert incident.details["collective_seq_id"] == meta["expected"]["collective_seq_id"]
    assert incident.details["detected_by"] == "watchdog"
    assert any("Timed out waiting" in e.text for e in incident.evidence)


def test_real_progress_stall_requests_dumps_and_blames_the_skipping_rank(
    torch_artifacts: dict[str, Path], store_dir: Path
) -> None:
    artifact = torch_artifacts["hang"]
    meta = _meta(artifact)
    # only progress: the steps stopped
    shutil.copytree(artifact / "store", store_dir, dirs_exist_ok=True)
    requests = []

    def request_dumps(suspect):
        """What a live requester does once the job is asked (signal or trigger file): read the dumps
        written.
        """
        requests.append(suspect)
        identity = NodeIdentity(node=None, job_id=suspect.job_id, attempt=suspect.attempt)  # type: ignore[arg-type]
        return read_dump_dir(artifact / "dumps", identity=identity).table

    # the fixture job ran only 3 steps before the hang: count them all in the baseline (no warm-up
    # to skip)
    defaults = load_thresholds()
    short_job = defaults.model_copy(update={"progress": defaults.progress.model_copy(
        update={"warmup_steps": 0, "min_baseline_steps": 2})})
    engine = Engine(catalog=load_xid_catalog(), thresholds=short_job, dump_requester=request_dumps)
    with Store(str(store_dir)) as store:
        last = store.query("SELECT max(end_ts) AS t FROM steps").to_pylist()[0]["t"]

    assert hangs(store_dir, engine, now=last + dt.timedelta(seconds=10)) == []
    assert requests == []
    (incident,) = hangs(store_dir, engine, now=last + dt.timedelta(seconds=45))

    assert len(requests) == 1 and requests[0].detected_by == "progress"
    assert incident.culprit_ranks == tuple(meta["culprit_ranks"])
    assert incident.culprit_nodes == (meta["node"],)
    assert incident.details["verdict"] == "never_joined"
    assert incident.step == meta["fault_step"] - 1  # the last step every rank completed
    assert abs((incident.first_signal_ts - last).total_seconds()) < 1e-5


def test_real_subgroup_hang_names_the_sub_group_and_its_skipping_rank(
    torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine
) -> None:
    artifact = torch_artifacts["subgroup_hang"]
    meta = _meta(artifact)
    ingest_torch_artifacts(artifact, store_dir, dumps="dumps", job=meta["run_id"])

    (incident,) = hangs(store_dir, engine)

    assert incident.culprit_ranks == tuple(meta["culprit_ranks"])
    assert incident.details["pg"] == meta["expected"]["pg_desc"]
    assert "pair_2_3" in incident.summary


def test_cli_dump_requester_touches_the_trigger_and_stores_the_dump_set(
    torch_artifacts: dict[str, Path], store_dir: Path, tmp_path: Path
) -> None:
    from faultlens.attribution.detectors.progress import HangSuspect
    from faultlens.controller.cli.attribution_cmds import DumpRequester

    artifact = torch_artifacts["hang"]
    trigger = tmp_path / "fr" / "trigger"
    requester = DumpRequester(
        str(store_dir), artifact / "dumps", trigger=trigger, wait_s=0.3, host="node-0"
    )
    suspect = HangSuspect("faultlens-hang", 0, at(0), "progress", 2, 60.0, 30.0, ())

    table = requester(suspect)

    assert trigger.exists()  # the ranks poll its mtime (interface 4)
    assert sorted(set(table.column("rank").to_pylist())) == [0, 1, 2, 3]
    with Store(str(store_dir)) as store:
        stored = store.query(
            "SELECT DISTINCT job_id, attempt, rank FROM collectives ORDER BY rank"
        ).to_pylist()
    assert stored == [{"job_id": "faultlens-hang", "attempt": 0, "rank": r} for r in range(4)]
