"""Crash attribution: the primary failure among many, its cause from GPU events, fingerprints and
signatures.

Rows follow the interfaces of the helper brief (process_events: interface 3; gpu_events: interface
2, here produced by the gpu helper's real kernel-log parser from the reference's real Xid lines) and
go through a real store."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from faultlens.attribution.detectors.crash import CrashAttributor, FailureKind
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store
from faultlens.attribution.rules import RulesError, load_crash_rules
from faultlens.collectors.sources.kmsg import read_kernel_log
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from tests.engine_rows import T0, at, event, ingest_torch_artifacts, ranks_rows, steps_rows, write

CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
          "peer "
          "[127.0.0.1]:15242. This is typically caused by a remote worker crashing.")
TIMED_OUT = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed "
             "out waiting 10000ms "
             "for recv operation to complete")


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def crashes(store: Path, engine: Engine) -> list:
    return [
        i for i in attribute(str(store), engine=engine) if i.incident_class == IncidentClass.CRASH
    ]


def survivors(
    world: int,
    primary: int,
    ts: float,
    *,
    lines: int = 1,
    attempt: int = 0,
    per_node: int = 4,
    job: str = "job-1",
) -> list[dict]:
    """What the other ranks say when `primary` dies: closed connections, then torchrun's SIGTERM."""
    rows = []
    for rank in range(world):
        if rank == primary:
            continue
        for i in range(lines):
            rows.append(
                event(
                    "comm_error",
                    rank,
                    ts + 0.5 + i * 1e-3,
                    source="stderr",
                    message=CLOSED,
                    is_secondary=True,
                    attempt=attempt,
                    per_node=per_node,
                    job=job,
                )
            )
        rows.append(
            event(
                "exit",
                rank,
                ts + 3.0,
                source="torchrun_report",
                exit_code=-15,
                signal="SIGTERM",
                is_secondary=True,
                attempt=attempt,
                per_node=per_node,
                job=job,
            )
        )
    return rows


def test_cascade_of_thousands_of_secondary_lines_is_one_incident(
    store_dir: Path, engine: Engine
) -> None:
    world, per_node = 64, 8
    write(store_dir, "ranks", ranks_rows("job-1", 0, world, per_node))
    rows = [event("exception", 37, 100.0, source="error_json", exception_type="ValueError",
                  message="ValueError: shapes do not match", traceback="Traceback ...\nValueError: "
                                                                       "shapes",
                  fingerprint="fp-shapes", per_node=per_node),
            event("exit", 37, 101.0, source="torchrun_report", exit_code=1, per_node=per_node)]
    rows += survivors(world, 37, 100.0, lines=80, per_node=per_node)
    # torchrun's Root Cause names a survivor (its timestamp came first): recorded as-is, must not be
    # believed
    rows.append(
        event(
            "comm_error",
            0,
            99.9,
            source="torchrun_report",
            message=CLOSED,
            per_node=per_node,
            error_file="<N/A>",
        )
    )
    write(store_dir, "process_events", rows)
    assert len(rows) > 5000

    found = crashes(store_dir, engine)

    assert len(found) == 1
    incident = found[0]
    assert incident.culprit_ranks == (37,)
    assert incident.culprit_nodes == ("node-04",)
    assert incident.cause == Cause.SOFTWARE
    assert incident.fingerprint == "fp-shapes"
    assert any(
        "folded into this incident" in e.text and "63 other rank(s)" in e.text
        for e in incident.evidence
    )


def test_sigkill_noticed_late_still_beats_the_survivors_echoes(
    store_dir: Path, engine: Engine
) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    # torchrun notices the SIGKILL 5 s after the survivors already complained
    rows = [event("exit", 1, 10.0, source="torchrun_report", exit_code=-9, signal="SIGKILL")]
    # unflagged echoes
    rows += [event("comm_error", r, 5.0, source="stderr", message=CLOSED) for r in (0, 2, 3)]
    rows += [event("exit", r, 10.0, source="torchrun_report", exit_code=1) for r in (0, 2, 3)]
    write(store_dir, "process_events", rows)

    (incident,) = crashes(store_dir, engine)

    assert incident.culprit_ranks == (1,)
    assert incident.rule == "crash-killed-by-signal"
    assert incident.cause == Cause.UNKNOWN  # no hardware evidence: killed, reason unknown


def test_hardware_cause_from_real_xid79_kernel_line_on_the_culprits_node(
    store_dir: Path, engine: Engine, tmp_path: Path
) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 8, 4))
    rows = [event("exit", 6, 60.0, source="supervisor", exit_code=-6, signal="SIGABRT")]
    rows += survivors(8, 6, 61.0)
    write(store_dir, "process_events", rows)
    log = tmp_path / "kern.log"
    stamp = at(30.0).isoformat()
    log.write_text(f"{stamp} node-01 kernel: NVRM: Xid (PCI:0000:1a:00): 79, GPU has fallen off "
                   "the bus.\n"
                   f"{at(31).isoformat()} node-00 kernel: NVRM: Xid (PCI:0000:07:00): 13, pid=1, "
                   "name=python3, "
                   "Graphics Exception\n")
    imported = read_kernel_log(log, NodeIdentity(node="node-01"), host_from_line=True)
    write(store_dir, "gpu_events", imported.rows)

    (incident,) = crashes(store_dir, engine)

    assert incident.culprit_ranks == (6,)
    assert incident.culprit_nodes == ("node-01",)
    assert incident.cause == Cause.PCIE  # the catalog's component of Xid 79
    # rank 6 = local rank 2 on PCI 00000000:1A:00.0
    assert incident.rule == "crash-hardware-same-gpu"
    assert incident.culprit_gpus == ("GPU-0102aaaa",)
    assert incident.first_signal_ts == at(30.0)
    assert any("Xid 79" in e.text and "FALLEN_OFF_THE_BUS" in e.text for e in incident.evidence)


def test_application_xid_is_not_hardware_evidence(
    store_dir: Path, engine: Engine, tmp_path: Path
) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    rows = [
        event(
            "exception",
            2,
            50.0,
            source="error_json",
            exception_type="RuntimeError",
            message="RuntimeError: CUDA error: an illegal memory access was encountered",
            fingerprint="fp-ima",
        )
    ]
    rows += survivors(4, 2, 50.0)
    write(store_dir, "process_events", rows)
    log = tmp_path / "kern.log"
    log.write_text(f"{at(49).isoformat()} node-00 kernel: NVRM: Xid (PCI:0000:00:07): 31, "
                   "pid=2512125, "
                   "name=python3.10, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS "
                   "GPCCLIENT_T1_8 faulted "
                   "@ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE\n")
    write(store_dir, "gpu_events", read_kernel_log(log, NodeIdentity(node="node-00")).rows)

    (incident,) = crashes(store_dir, engine)

    assert incident.culprit_ranks == (2,)
    assert incident.cause == Cause.SOFTWARE


def test_dbe_outside_the_window_is_not_blamed(
    store_dir: Path, engine: Engine, tmp_path: Path
) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", [event("exit", 3, 5000.0, exit_code=-9, signal="SIGKILL")])
    log = tmp_path / "kern.log"
    log.write_text(f"{at(10).isoformat()} node-00 kernel: NVRM: Xid (PCI:0000:07:00): 48, "
                   "pid='<unknown>', "
                   "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on "
                   "GPU in the "
                   "framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.\n")
    write(store_dir, "gpu_events", read_kernel_log(log, NodeIdentity(node="node-00")).rows)

    (incident,) = crashes(store_dir, engine)

    assert incident.cause == Cause.UNKNOWN


def test_dbe_in_window_gives_hbm_on_the_node(
    store_dir: Path, engine: Engine, tmp_path: Path
) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 8, 4, with_gpu=False))
    write(store_dir, "process_events", [event("exit", 5, 500.0, exit_code=-9, signal="SIGKILL"),
                                        *survivors(8, 5, 500.0)])
    log = tmp_path / "kern.log"
    log.write_text(f"{at(420).isoformat()} node-01 kernel: NVRM: Xid (PCI:0000:07:00): 48, "
                   "pid='<unknown>', "
                   "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on "
                   "GPU in the "
                   "framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.\n")
    write(store_dir, "gpu_events", read_kernel_log(log, NodeIdentity(node="node-01")).rows)

    (incident,) = crashes(store_dir, engine)

    assert incident.cause == Cause.HBM
    assert incident.rule == "crash-hardware-same-node"  # the rank's GPU is not known: node-level
    assert incident.culprit_nodes == ("node-01",)
    assert incident.culprit_gpus == ("00000000:07:00.0",)


def test_same_fingerprint_on_different_nodes_is_software_with_no_node_blamed(
    store_dir: Path, engine: Engine
) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 8, 4))
    rows = [event("exception", r, 20.0 + r * 0.01, source="error_json", exception_type="KeyError",
                  message="KeyError: 'labels'", fingerprint="fp-key") for r in (1, 5)]
    rows += [event("exit", r, 21.0, exit_code=-15, signal="SIGTERM") for r in (0, 2, 3, 4, 6, 7)]
    write(store_dir, "process_events", rows)

    (incident,) = crashes(store_dir, engine)

    assert incident.cause == Cause.SOFTWARE
    assert incident.rule == "crash-software-same-fingerprint-multi-node"
    assert incident.culprit_ranks == (1, 5)
    assert incident.culprit_nodes == ()


def test_repeat_at_the_same_step_after_restart_is_software(store_dir: Path, engine: Engine) -> None:
    def sections(rank: int, step: int) -> dict[str, float]:
        return {"forward": 0.1, "backward": 0.2}

    for attempt, start in ((0, 0.0), (1, 1000.0)):
        write(store_dir, "ranks", ranks_rows("job-1", attempt, 4, 2, start=start))
        write(store_dir, "steps", steps_rows("job-1", attempt, 4, 2, range(0, 42), start=start + 1,
                                             sections=sections))
        rank = 3 if attempt == 0 else 0  # a different node each time
        write(
            store_dir,
            "process_events",
            [
                event(
                    "exception",
                    rank,
                    start + 30.0,
                    attempt=attempt,
                    per_node=2,
                    exception_type="IndexError",
                    message="IndexError: index 4096 is out of bounds",
                    fingerprint="fp-oob",
                ),
                *survivors(4, rank, start + 30.0, attempt=attempt, per_node=2),
            ],
        )

    found = {i.attempt: i for i in crashes(store_dir, engine)}

    assert set(found) == {0, 1}
    assert found[0].cause == Cause.SOFTWARE and found[0].rule == "crash-exception"
    assert found[1].rule == "crash-software-repeat-same-step"
    assert found[1].step == 42
    assert found[1].culprit_nodes == ()


def test_cuda_oom_signature(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(
        store_dir,
        "process_events",
        [
            event(
                "oom",
                2,
                10.0,
                exception_type="torch.OutOfMemoryError",
                message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                fingerprint="fp-oom",
            ),
            *survivors(4, 2, 10.0),
        ],
    )

    (incident,) = crashes(store_dir, engine)

    assert incident.cause == Cause.OOM
    assert incident.culprit_ranks == (2,)


def test_only_collective_timeouts_is_a_hang_not_a_crash(store_dir: Path) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", [
        *(event("comm_error", r, 40.0 + r, message=TIMED_OUT, is_secondary=True) for r in range(4)),
        *(event("exit", r, 45.0, exit_code=1) for r in range(4))])
    telemetry = load_from_store_dir(store_dir)

    result = CrashAttributor(load_crash_rules(), load_xid_catalog()).attribute(telemetry, T0)

    assert result.incidents == []
    assert len(result.hang_triggers) == 1
    assert result.hang_triggers[0].ts == at(40.0)


def test_a_job_stopped_from_outside_is_no_crash(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(
        store_dir,
        "process_events",
        [event("exit", r, 9.0, exit_code=-15, signal="SIGTERM") for r in range(4)],
    )

    assert crashes(store_dir, engine) == []


def test_rank_kinds_from_exit_codes() -> None:
    attributor = CrashAttributor(load_crash_rules(), None)
    import pandas as pd

    frame = pd.DataFrame([
        event("exit", 0, 1.0, exit_code=137), event("exit", 1, 1.0, exit_code=143),
        event("exit", 2, 1.0, exit_code=1), event("exit", 3, 1.0, exit_code=0)])
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    kinds = {f.rank: f.kind for f in attributor.attempt_failures(frame)[("job-1", 0)]}

    assert kinds == {0: FailureKind.KILLED, 1: FailureKind.TERMINATED, 2: FailureKind.EXITED}


def test_bad_crash_rules_name_file_key_and_expectation(tmp_path: Path) -> None:
    good = (Path(__file__).resolve().parents[1] / "rules" / "crash.yaml").read_text()
    bad = tmp_path / "crash.yaml"
    bad.write_text(good.replace("signal_notice_slack_s: 30", "signal_notice_slack_s: -1"))
    with pytest.raises(RulesError, match=r"crash\.yaml: signal_notice_slack_s: expected greater "
                                         r"than or equal"):
        load_crash_rules(bad)
    bad.write_text(good.replace('message: "No space left on device"', 'message: "No space (left"'))
    with pytest.raises(RulesError, match=r"signatures\[6\]\.message: .*regular expression"):
        load_crash_rules(bad)
    bad.write_text(good.replace("format_version: 1", "format_version: 7"))
    with pytest.raises(RulesError, match=r"format_version: expected 1, got 7"):
        load_crash_rules(bad)


def load_from_store_dir(store_dir: Path):
    with Store(str(store_dir)) as store:
        return load_from_store(store).for_job("job-1")


# ---------------------------------------------------------------- real torchrun artifacts
# (interface 6)


def _meta(artifact: Path) -> dict:
    return json.loads((artifact / "meta.json").read_text())


def test_real_torchrun_exception_crash_blames_the_raising_rank_in_both_attempts(
        torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine) -> None:
    artifact = torch_artifacts["crash_exception"]
    ingest_torch_artifacts(artifact, store_dir)
    meta = _meta(artifact)

    found = {i.attempt: i for i in crashes(store_dir, engine)}

    assert set(found) == {0, 1}  # one incident per attempt, whatever the number of lines
    for incident in found.values():
        assert incident.culprit_ranks == tuple(meta["culprit_ranks"])
        assert incident.step == meta["expected"]["step"]
        assert incident.summary.startswith(f"crash: rank {meta['culprit_ranks'][0]}")
        assert any("folded into this incident" in e.text for e in incident.evidence)
    assert found[0].cause == Cause.SOFTWARE and found[0].rule == "crash-exception"
    # the restart failed the same way at the same step: a deterministic bug, nothing to fail over
    assert found[1].rule == "crash-software-repeat-same-step" and found[1].culprit_nodes == ()


def test_real_torchrun_sigkill_crash_blames_the_killed_rank(
    torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine
) -> None:
    artifact = torch_artifacts["crash_sigkill"]
    ingest_torch_artifacts(artifact, store_dir)

    (incident,) = crashes(store_dir, engine)

    assert incident.culprit_ranks == tuple(_meta(artifact)["culprit_ranks"])
    assert incident.rule == "crash-killed-by-signal"
    assert "SIGKILL" in incident.summary


def test_real_sigkill_with_a_real_xid79_line_on_its_node_is_hardware(
    torch_artifacts: dict[str, Path], store_dir: Path, tmp_path: Path, engine: Engine
) -> None:
    artifact = torch_artifacts["crash_sigkill"]
    ingest_torch_artifacts(artifact, store_dir)
    with Store(str(store_dir)) as store:
        killed = store.query(
            "SELECT ts, node FROM process_events WHERE signal = 'SIGKILL'"
        ).to_pylist()[0]
    # the node's kernel log: the GPU fell off the bus 20 s before torchrun noticed the dead rank
    log = tmp_path / "kern.log"
    when = (killed["ts"] - dt.timedelta(seconds=20)).isoformat()
    log.write_text(f"{when} {killed['node']} kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has "
                   "fallen off the bus.\n")
    write(
        store_dir,
        "gpu_events",
        read_kernel_log(log, NodeIdentity(node="other"), host_from_line=True).rows,
    )

    (incident,) = crashes(store_dir, engine)

    assert incident.culprit_ranks == (1,)
    assert incident.cause == Cause.PCIE
    assert incident.culprit_nodes == (killed["node"],)
    assert incident.culprit_gpus == ("00000000:2B:00.0",)
    assert incident.first_signal_ts < killed["ts"]


def test_real_sigkill_survivors_dumps_corroborate_the_killed_rank(
    torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine
) -> None:
    artifact = torch_artifacts["crash_sigkill"]
    meta = _meta(artifact)
    # rank 1 wrote none
    ingest_torch_artifacts(artifact, store_dir, dumps="dumps", job=meta["run_id"])

    (incident,) = crashes(store_dir, engine)

    assert incident.culprit_ranks == (1,)
    assert any(e.table == "collectives" and "dumps agree" in e.text for e in incident.evidence)


def test_timeouts_before_the_first_failure_mean_the_job_hung_first(store_dir: Path) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", [
        *(event("comm_error", r, 40.0, message=TIMED_OUT, is_secondary=True) for r in (0, 1, 3)),
        # the stuck rank gives up later with an exception of its own: a consequence of the hang
        event("exception", 2, 55.0, exception_type="TimeoutError", message="TimeoutError: rank 2 "
                                                                           "stuck for 15s",
              fingerprint="fp-stuck")])
    telemetry = load_from_store_dir(store_dir)

    result = CrashAttributor(load_crash_rules(), load_xid_catalog()).attribute(telemetry, T0)

    assert result.incidents == []
    (trigger,) = result.hang_triggers
    assert trigger.ts == at(40.0) and (trigger.job_id, trigger.attempt) == ("job-1", 0)
    assert "after the timeouts: rank 2" in trigger.evidence[-1].text


def test_a_crash_whose_peers_time_out_later_stays_a_crash(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(
        store_dir,
        "process_events",
        [
            event(
                "exception",
                2,
                40.0,
                exception_type="ValueError",
                message="ValueError: bad batch",
                fingerprint="f",
            ),
            *(
                event("comm_error", r, 640.0, message=TIMED_OUT, is_secondary=True)
                for r in (0, 1, 3)
            ),
        ],
    )

    (incident,) = crashes(store_dir, engine)

    assert incident.culprit_ranks == (2,)
