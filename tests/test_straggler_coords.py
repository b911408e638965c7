"""Stragglers by parallel coordinates (issue 13, "What was seen"): a slow stage in every replica
with 2 replicas, a slow replica, one slow worker with 1, 2 and many replicas, slow ranks one per
node, communication sections with Megatron and c10d names, and evidence that cites only tables that
exist.

Steps are synchronous (tests/engine_rows.steps_rows: every rank's step lasts as long as the slowest
rank's compute, the others wait in their communication section)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from faultlens.attribution.detectors.straggler.vocab import (
    SectionKind,
    VocabularyError,
    load_vocabulary,
)
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from tests.engine_rows import ranks_rows, steps_rows, write


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def stragglers(store: Path, engine: Engine) -> list:
    return [
        i
        for i in attribute(str(store), engine=engine)
        if i.incident_class == IncidentClass.STRAGGLER
    ]


def base(seed: int, names: tuple[str, str] = ("forward", "backward")):
    rng = random.Random(seed)

    def sections(rank: int, step: int) -> dict[str, float]:
        return {names[0]: 0.10 * rng.uniform(0.97, 1.03), names[1]: 0.20 * rng.uniform(0.97, 1.03),
                "optimizer": 0.02 * rng.uniform(0.97, 1.03)}

    return sections


def job(
    store: Path, world: int, per_node: int, sections, *, pp: int | None, steps: int = 80
) -> None:
    rows = steps_rows("job-1", 0, world, per_node, range(steps), start=1.0, sections=sections)
    write(store, "ranks", ranks_rows("job-1", 0, world, per_node, pp_size=pp))
    write(store, "steps", rows)


@pytest.mark.parametrize("replicas,stages", [(2, 4), (4, 2), (3, 4)])
def test_a_stage_slow_in_every_replica_is_one_systemic_incident(
    store_dir: Path, engine: Engine, replicas: int, stages: int
) -> None:
    """Issue 13: with 2 replicas the detector named the slow stage's ranks single-rank stragglers.
    """
    sections0 = base(1)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank % stages == stages - 1:  # the last stage (a heavier loss head) in every replica
            s["forward"] *= 1.8
        return s

    job(store_dir, replicas * stages, 2, sections, pp=stages)

    (incident,) = stragglers(store_dir, engine)

    assert (
        incident.cause == Cause.WORKLOAD_IMBALANCE and incident.rule == "straggler-pipeline-stage"
    )
    assert incident.culprit_nodes == ()
    assert f"pipeline stage {stages - 1}" in incident.evidence[0].text
    assert "every replica" in incident.evidence[0].text
    assert any(e.text.startswith("what-if") and "saves" in e.text for e in incident.evidence)


@pytest.mark.parametrize("replicas,stages,slow", [(2, 4, 6), (4, 2, 5), (8, 4, 13)])
def test_one_slow_worker_is_its_node_only(
    store_dir: Path, engine: Engine, replicas: int, stages: int, slow: int
) -> None:
    sections0 = base(2)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank == slow and step >= 30:
            s["forward"] *= 2.0
        return s

    job(store_dir, replicas * stages, 2, sections, pp=stages)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (slow,)
    assert incident.culprit_nodes == (f"node-{slow // 2:02d}",)
    assert incident.cause == Cause.UNKNOWN
    assert "became slow" in incident.evidence[0].text
    comparison = "pairwise" if replicas == 2 else f"median of {replicas}"
    assert comparison in incident.evidence[0].text
    # strong, persistent timing evidence is enough without GPU samples
    assert incident.confidence >= 0.7
    assert incident.details["saving_fraction"] > 0.05


def test_one_replica_compares_a_worker_with_its_own_history(
    store_dir: Path, engine: Engine
) -> None:
    sections0 = base(3)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank == 2 and step >= 40:
            s["backward"] *= 1.6
        return s

    job(store_dir, 4, 1, sections, pp=4)  # 1 replica x 4 stages, one rank per node

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (2,) and incident.culprit_nodes == ("node-02",)
    assert "own earlier median (1 replica)" in incident.evidence[0].text


def test_one_replica_with_a_stage_slow_from_the_start_is_an_imbalance(
    store_dir: Path, engine: Engine
) -> None:
    sections0 = base(4)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank == 3:
            s["forward"] *= 1.8
        return s

    job(store_dir, 4, 1, sections, pp=4)

    (incident,) = stragglers(store_dir, engine)

    assert incident.cause == Cause.WORKLOAD_IMBALANCE and incident.culprit_nodes == ()


@pytest.mark.parametrize("replicas,stages,per_node", [(2, 4, 2), (4, 2, 2), (4, 4, 4)])
def test_one_slow_replica_is_named_as_a_replica(
    store_dir: Path, engine: Engine, replicas: int, stages: int, per_node: int
) -> None:
    sections0 = base(5)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank // stages == 1 and step >= 30:  # every stage of replica 1
            s["backward"] *= 1.5
        return s

    job(store_dir, replicas * stages, per_node, sections, pp=stages)

    (incident,) = stragglers(store_dir, engine)

    replica_ranks = tuple(range(stages, 2 * stages))
    assert incident.culprit_ranks == replica_ranks
    assert "replica 1" in incident.summary
    nodes = sorted({f"node-{r // per_node:02d}" for r in replica_ranks})
    if len(nodes) == 1:
        assert incident.rule == "straggler-replica-node" and incident.culprit_nodes == tuple(nodes)
    else:  # spread over nodes: what they share, no node excluded
        assert incident.rule == "straggler-replica" and incident.culprit_nodes == ()
        assert all(n in incident.summary for n in nodes) and "share" in incident.summary


def test_slow_ranks_one_per_node_on_many_nodes_are_systemic(
    store_dir: Path, engine: Engine
) -> None:
    """Issue 13: the systemic check could never fire when each node holds one rank."""
    sections0 = base(6)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank in (1, 4, 6):
            s["forward"] *= 1.8
        return s

    job(store_dir, 8, 1, sections, pp=None)

    (incident,) = stragglers(store_dir, engine)

    assert incident.cause == Cause.WORKLOAD_IMBALANCE and incident.culprit_nodes == ()
    assert incident.rule == "straggler-systemic"


@pytest.mark.parametrize(
    "comm",
    [
        "params-all-gather",
        "reduce-scatter",
        "forward-send",
        "backward-recv",
        "send",
        "recv",
        "forward-send-backward-recv",
        "nccl:_allgather_base",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "ncclDevKernel_SendRecv",
    ],
)
def test_waiting_under_common_communication_names_is_not_compute(
    store_dir: Path, engine: Engine, comm: str
) -> None:
    """Issue 13: timer names like params-all-gather or forward-send slipped through as compute, so
    the healthy ranks that wait for the slow one (its replica's other stages, in pipeline send/recv)
    were blamed with it. Here the slow worker's replica waits in `comm`, the other replicas in
    all-grads-sync."""
    sections0 = base(7, ("forward-compute", "backward-compute"))

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank == 5 and step >= 30:
            s["forward-compute"] *= 2.0
        return s

    # 4 replicas x 2 stages, one rank per node: rank 5 is replica 2, stage 1; rank 4 (stage 0 of its
    # replica) waits for it in pipeline traffic
    rows = steps_rows("job-1", 0, 8, 1, range(80), start=1.0, sections=sections)
    for row in rows:
        row["sections"][comm if row["rank"] // 2 == 2 else "all-grads-sync"] = row["sections"].pop(
            "comm"
        )
    write(store_dir, "ranks", ranks_rows("job-1", 0, 8, 1, pp_size=2))
    write(store_dir, "steps", rows)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (5,) and incident.culprit_nodes == ("node-05",)


def test_a_section_of_unknown_kind_is_reported_never_scored(
    store_dir: Path, engine: Engine
) -> None:
    sections0 = base(8)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        # rank 3 is slow only in a section nobody knows
        s["my_custom_thing"] = 0.05 if rank != 3 else 0.15
        if rank == 6 and step >= 30:
            # 200 ms slower: fixing it saves what it costs beyond rank 3's 100 ms (rank 3 arrives at
            # the all-reduce that much late too; the what-if sees it there, never scoring the
            # section)
            s["forward"] *= 3.0
        return s

    job(store_dir, 8, 2, sections, pp=4)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (6,)
    assert any("unknown kind" in e.text and "my_custom_thing" in e.text for e in incident.evidence)


def test_without_gpu_samples_no_evidence_cites_them(store_dir: Path, engine: Engine) -> None:
    """Issue 13: a rank 'stands out on clocks, temperature, power' (with a confidence bonus) in a
    store without gpu_samples."""
    sections0 = base(9)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if 8 <= rank < 16 and step > 30:
            s["forward"] *= 1.5
        return s

    job(store_dir, 64, 8, sections, pp=None)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_nodes == ("node-01",)
    assert all(e.table == "steps" for e in incident.evidence)
    assert not any(
        word in e.text for e in incident.evidence for word in ("clocks", "temperature", "power")
    )
    assert "no GPU samples" in incident.summary


def test_vocabulary_classifies_c10d_megatron_and_nccl_names() -> None:
    vocabulary = load_vocabulary()
    expect = {
        "nccl:all_reduce": ("comm", "all_reduce"),
        "gloo:all_reduce": ("comm", "all_reduce"),
        "nccl:_reduce_scatter_base": ("comm", "reduce_scatter"),
        "nccl:all_to_all": ("comm", "all_to_all"),
        "nccl:send": ("comm", "p2p"),
        "forward-send-backward-recv": ("comm", "p2p"),
        "layernorm-grads-all-reduce": ("comm", "all_reduce"),
        "grads-reduce-scatter": ("comm", "reduce_scatter"),
        "ncclDevKernel_SendRecv": ("comm", "p2p"),
        "ncclKernel_Broadcast_RING_LL": ("comm", "broadcast"),
        "nccl:all_reduce_coalesced": ("comm", "all_reduce"),
        "forward-compute": ("compute", None),
        "backward-compute": ("compute", None),
        "optimizer-inner-step": ("compute", None),
        "batch-generator": ("data", None),
        "forward-backward": ("wrapper", None),
        "checkpoint": ("excluded", None),
        "forward/attention": ("compute", None),
        "frobnicate": ("unknown", None),
    }
    for name, (kind, op) in expect.items():
        found = vocabulary.classify(name)
        assert (found.kind.value, found.op) == (kind, op), name


def test_nested_sections_and_cuda_twins_are_not_counted_twice() -> None:
    chosen, _ = load_vocabulary().scored(
        ["forward", "forward/attention", "backward", "cuda/backward", "comm"]
    )
    assert chosen == ["forward", "cuda/backward"]


def test_user_vocabulary_extends_and_bad_files_name_the_key(tmp_path: Path) -> None:
    extra = tmp_path / "mine.yaml"
    extra.write_text("format_version: 1\nkinds:\n  - kind: comm\n    op: p2p\n    exact: "
                     "[frobnicate]\n"
                     "  - kind: compute\n    prefixes: [my_]\n")
    vocabulary = load_vocabulary([extra])
    assert vocabulary.classify("frobnicate").kind is SectionKind.COMM
    assert vocabulary.classify("my_custom_thing").kind is SectionKind.COMPUTE
    extra.write_text("format_version: 1\nkinds:\n  - kind: sometimes\n")
    with pytest.raises(VocabularyError, match=r"mine\.yaml: kinds\[0\]\.kind"):
        load_vocabulary([extra])


def test_a_slow_rank_whose_peers_wait_inside_backward_still_costs_step_time(
    store_dir: Path, engine: Engine
) -> None:
    """DDP overlaps the gradient all-reduce with backward: the peers' backward holds their waiting,
    every rank's compute total is alike, and only the slow rank's forward shows it (the demo's
    straggler). The what-if must not call that immaterial."""
    sections0 = base(10)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = sections0(rank, step)
        if rank == 3 and step >= 20:
            s["forward"] *= 4.0
        return s

    rows = steps_rows("job-1", 0, 4, 2, range(60), start=1.0, sections=sections)
    for row in rows:
        row["sections"]["backward"] += row["sections"].pop("comm")  # the wait inside backward
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 2, pp_size=1))
    write(store_dir, "steps", rows)

    (incident,) = stragglers(store_dir, engine)

    assert incident.culprit_ranks == (3,)
    assert incident.details["saving_fraction"] > 0.3
