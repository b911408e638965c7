"""Straggler detection: per-rank compute sections against peers and own history, persistence, one
worker vs systemic imbalance, and the GPU clocks-event reasons that explain a slow GPU.

Steps are synchronous as in real data-parallel training (every rank's step lasts as long as the
slowest rank's compute; the others wait in `comm`), so the step wall time alone never points at
anyone."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.rules import RulesError, load_thresholds
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from tests.engine_rows import at, ingest_torch_artifacts, ranks_rows, steps_rows, write


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def stragglers(store: Path, engine: Engine) -> list:
    return [
        i
        for i in attribute(str(store), engine=engine)
        if i.incident_class == IncidentClass.STRAGGLER
    ]


def jittered(seed: int):
    rng = random.Random(seed)

    def sections(rank: int, step: int) -> dict[str, float]:
        return {
            "data": 0.005 * rng.uniform(0.9, 1.1),
            "forward": 0.10 * rng.uniform(0.97, 1.03),
            "backward": 0.20 * rng.uniform(0.97, 1.03),
            "optimizer": 0.02 * rng.uniform(0.97, 1.03),
        }

    return sections


def job(
    store: Path,
    world: int,
    per_node: int,
    sections,
    *,
    steps: int = 100,
    pp: int | None = None,
    phase=None,
) -> None:
    write(store, "ranks", ranks_rows("job-1", 0, world, per_node, pp_size=pp))
    write(
        store,
        "steps",
        steps_rows(
            "job-1", 0, world, per_node, range(steps), start=1.0, sections=sections, phase=phase
        ),
    )


def test_one_slow_rank_is_found_by_its_compute_section_not_step_time(
    store_dir: Path, engine: Engine
) -> None:
    base = jittered(1)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank == 13 and step >= 30:
            s["forward"] *= 1.6
        return s

    job(store_dir, 32, 8, sections)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (13,)
    assert incident.culprit_nodes == ("node-01",)
    assert incident.culprit_gpus == ("GPU-0105aaaa",)
    assert incident.cause == Cause.UNKNOWN  # no GPU samples to explain it
    assert incident.first_signal_ts >= at(30 * 0.33)  # not before the slowdown began
    assert any(
        "slowest section forward" in e.text and "became slow" in e.text for e in incident.evidence
    )


def test_thermal_throttling_on_the_culprit_gpu_gives_cause_thermal(
    store_dir: Path, engine: Engine
) -> None:
    base = jittered(2)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank == 5:
            s["forward"] *= 1.5
            s["backward"] *= 1.5
        return s

    job(store_dir, 16, 8, sections, steps=60)
    samples = []
    for second in range(0, 25):
        for node in ("node-00", "node-01"):
            for index in range(8):
                hot = node == "node-00" and index == 5
                samples.append(
                    {
                        "ts": at(second),
                        "node": node,
                        "gpu_index": index,
                        "source": "recorded",
                        "gpu_uuid": f"GPU-{node[-2:]}{index:02d}aaaa",
                        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
                        "temp_c": 91.0 if hot else 64.0,
                        "sm_clock_mhz": 1200 if hot else 1980,
                        "power_w": 500.0,
                        "clocks_event_reasons": 0x40 | 0x08 if hot else 0,
                    }
                )
    write(store_dir, "gpu_samples", samples)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (5,)
    assert incident.cause == Cause.THERMAL
    assert incident.culprit_gpus == ("GPU-0005aaaa",)
    assert any("HwThermalSlowdown" in e.text for e in incident.evidence)
    assert any("temperature 91" in e.text for e in incident.evidence)


def test_whole_pipeline_stage_slower_is_workload_imbalance_with_no_node(
    store_dir: Path, engine: Engine
) -> None:
    base = jittered(3)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank % 4 == 3:  # pp_rank 3: the stage with the loss head
            s["forward"] *= 1.8
        return s

    job(store_dir, 32, 8, sections, pp=4)

    (incident,) = stragglers(store_dir, engine)

    assert incident.cause == Cause.WORKLOAD_IMBALANCE
    assert incident.rule == "straggler-pipeline-stage"
    assert incident.culprit_nodes == ()
    assert "pipeline stage 3" in incident.evidence[0].text


def test_slow_ranks_spread_over_nodes_without_stage_info_are_systemic(
    store_dir: Path, engine: Engine
) -> None:
    base = jittered(4)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank % 4 == 3:
            s["forward"] *= 1.8
        return s

    job(store_dir, 32, 8, sections)

    (incident,) = stragglers(store_dir, engine)

    assert incident.cause == Cause.WORKLOAD_IMBALANCE
    assert incident.culprit_nodes == ()


def test_imbalance_that_moves_between_ranks_blames_no_node(store_dir: Path, engine: Engine) -> None:
    base = jittered(5)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank == (step * 7) % 32:  # the long sequence lands on a different rank every step
            s["forward"] *= 2.0
        return s

    job(store_dir, 32, 8, sections)

    (incident,) = stragglers(store_dir, engine)

    assert incident.cause == Cause.WORKLOAD_IMBALANCE
    assert incident.rule == "straggler-moving-imbalance"
    assert incident.culprit_nodes == () and incident.culprit_ranks == ()


def test_transient_one_off_slow_steps_and_eval_steps_raise_nothing(
    store_dir: Path, engine: Engine
) -> None:
    base = jittered(6)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if (rank, step) in {(3, 10), (9, 40), (20, 70), (3, 71), (3, 90)}:
            s["backward"] *= 4  # GC pause, page cache miss: once
        if step % 20 == 0:
            s["forward"] *= 5 if rank < 16 else 1  # evaluation steps: slow and uneven by design
        return s

    job(store_dir, 32, 8, sections, phase=lambda step: "eval" if step % 20 == 0 else "train")

    assert stragglers(store_dir, engine) == []


def test_a_whole_slow_node_is_blamed_as_a_node(store_dir: Path, engine: Engine) -> None:
    base = jittered(7)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if 8 <= rank < 16 and step > 40:
            s["forward"] *= 1.5
        return s

    job(store_dir, 64, 8, sections)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_nodes == ("node-01",)
    assert incident.rule == "straggler-node"
    assert set(incident.culprit_ranks) == set(range(8, 16))
    assert any("robust covariance" in e.text for e in incident.evidence)


def test_two_ranks_are_scored_against_their_own_history(store_dir: Path, engine: Engine) -> None:
    base = jittered(8)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank == 1 and step > 40:
            s["forward"] *= 1.6
        return s

    job(store_dir, 2, 1, sections)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (1,)
    assert "its own earlier median" in incident.evidence[0].text


def test_bad_thresholds_name_file_key_and_expectation(tmp_path: Path) -> None:
    good = (Path(__file__).resolve().parents[1] / "rules" / "thresholds.yaml").read_text()
    bad = tmp_path / "thresholds.yaml"
    bad.write_text(good.replace("persistence: 0.6", "persistence: 1.5"))
    with pytest.raises(RulesError, match=r"thresholds\.yaml: straggler\.persistence: expected less "
                                         r"than or equal"):
        load_thresholds(bad)
    bad.write_text(good.replace("min_window_steps: 8", "min_window_steps: 80"))
    with pytest.raises(RulesError, match=r"straggler: expected min_window_steps at most "
                                         r"window_steps \(20\)"):
        load_thresholds(bad)
    bad.write_text(good.replace("  peer_z: 3.5\n", "  peer_z: 3.5\n  peer_zz: 1\n"))
    with pytest.raises(RulesError, match=r"straggler\.peer_zz: unknown key"):
        load_thresholds(bad)


def test_real_straggler_steps_blame_the_slow_rank_and_its_section(
    torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine
) -> None:
    artifact = torch_artifacts["straggler"]
    meta = json.loads((artifact / "meta.json").read_text())
    ingest_torch_artifacts(artifact, store_dir)

    found = attribute(str(store_dir), engine=engine)

    # a clean run: nothing else
    assert [i.incident_class for i in found] == [IncidentClass.STRAGGLER]
    (incident,) = found
    assert incident.culprit_ranks == tuple(meta["culprit_ranks"])
    assert incident.culprit_nodes == (meta["node"],)
    assert f"slowest section {meta['expected']['section']}" in incident.evidence[0].text


def test_real_steps_of_ranks_that_are_not_slow_raise_nothing(
    torch_artifacts: dict[str, Path], store_dir: Path, engine: Engine
) -> None:
    ingest_torch_artifacts(torch_artifacts["mismatch"], store_dir)  # a clean run with no straggler

    assert stragglers(store_dir, engine) == []


def test_thermal_slowdown_events_on_the_culprits_node_give_cause_thermal(
    store_dir: Path, engine: Engine
) -> None:
    base = jittered(9)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank == 10 and step >= 20:
            s["backward"] *= 1.5
        return s

    job(store_dir, 24, 8, sections, steps=60)
    write(
        store_dir,
        "gpu_events",
        [
            {
                "ts": at(6.5),
                "node": "node-01",
                "gpu_index": 2,
                "source": "nvml_sample",
                "kind": "thermal_slowdown_start",
                "message": "HwThermalSlowdown set",
            }
        ],
    )

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (10,)
    assert incident.cause == Cause.THERMAL
    assert any(
        e.table == "gpu_events" and "thermal_slowdown_start" in e.text for e in incident.evidence
    )


def test_thermal_slowdown_of_another_gpu_of_the_node_explains_nothing(
    store_dir: Path, engine: Engine
) -> None:
    base = jittered(9)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = base(rank, step)
        if rank == 10 and step >= 20:
            s["backward"] *= 1.5
        return s

    job(store_dir, 24, 8, sections, steps=60)
    write(
        store_dir,
        "gpu_events",
        [
            {
                "ts": at(6.5),
                "node": "node-01",
                "gpu_index": 7,
                "source": "nvml_sample",
                "kind": "thermal_slowdown_start",
                "message": "HwThermalSlowdown set",
            }
        ],
    )

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (10,)
    assert incident.cause == Cause.UNKNOWN
