"""A local-tier path belongs to its node: a restore never reads from a node excluded at an earlier
failover, nor from an excluded node's storage reached through another tier on a shared filesystem.
Checkpoints are written by the real tiered checkpointer (torch.save shards, commit markers,
manifests) in the layout `faultlens run` uses.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Decision, Restore
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.tiered import TieredCheckpointer
from faultlens.controller.checkpoints.tiers import Tier, TierKind
from faultlens.controller.restore import plan_restore, write_plan
from faultlens.controller.supervisor.run import RunConfig, Supervisor

pytest.importorskip("torch")

WORLD, PER_NODE = 4, 2


def _attempt(
    root: Path, placement: dict[str, int], steps: list[int], durable_every: int = 1000
) -> None:
    """Ranks node_rank*2, node_rank*2+1 on each node, checkpointing `steps` to their node's local
    tier (and every `durable_every` steps to the durable tier), as the demo job does under the
    supervisor."""
    checkpointers = []
    for node, node_rank in placement.items():
        for local in range(PER_NODE):
            checkpointers.append(
                TieredCheckpointer(
                    local=str(root / "nodes" / node / "ckpt"),
                    durable=str(root / "durable"),
                    rank=node_rank * PER_NODE + local,
                    world_size=WORLD,
                    local_rank=local,
                    local_world_size=PER_NODE,
                    node=node,
                    every_local=1,
                    every_durable=durable_every,
                    keep_local=0,
                )
            )
    for step in steps:
        for c in checkpointers:
            c.save(step, {"rank": c.rank, "step": step})
    for c in checkpointers:
        c.close(timeout=60)
    assert [c.errors for c in checkpointers] == [[]] * len(checkpointers)


def _tiers(root: Path, nodes: list[str]) -> list[Tier]:
    return [*(Tier(TierKind.LOCAL, str(root / "nodes" / n / "ckpt"), n) for n in nodes),
            Tier(TierKind.DURABLE, str(root / "durable"))]


def _failover(exclude: str, step: int | None) -> Decision:
    at = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    incident = Incident(
        incident_id=f"inc-{exclude}",
        incident_class=IncidentClass.CRASH,
        cause=Cause.GPU_HARDWARE,
        first_signal_ts=at,
        detected_ts=at,
        confidence=0.95,
        rule="test",
        summary="",
        job_id="job",
        attempt=1,
        culprit_nodes=(exclude,),
    )
    return Decision.for_incident(
        incident,
        action=Action.FAILOVER,
        policy_rule="test",
        reason="test",
        issued_at=at,
        exclude_nodes=(exclude,),
        restore=None if step is None else Restore("local", step),
    )


def test_the_second_restore_never_reads_a_node_excluded_at_the_first(tmp_path):
    # attempt 0 on node-0 (ranks 0,1) and node-1 (ranks 2,3): local checkpoints 10, durable 5 and 10
    _attempt(tmp_path, {"node-0": 0, "node-1": 1}, [5, 10], durable_every=5)
    # node-1 is failed over; attempt 1 on node-0 and node-2 checkpoints locally at step 20 only
    _attempt(tmp_path, {"node-0": 0, "node-2": 1}, [20])
    # the durable copy of step 10 never finished (the job was stopped while copying): only step 5 is
    # durable
    (tmp_path / "durable" / "step-00000010" / "manifest.json").unlink()
    supervisor = Supervisor(
        RunConfig(
            script=("train.py",),
            nnodes=2,
            nproc_per_node=PER_NODE,
            spares=1,
            store=str(tmp_path / "store"),
            workdir=tmp_path,
            job_id="job",
        )
    )
    try:
        supervisor.excluded.append("node-1")
        # what the supervisor does at the first failover
        supervisor.catalog.retire(supervisor.excluded)
        catalog = supervisor.catalog
        # the second failover excludes node-2: step 20 is gone with it; step 10 would need node-1's
        # local tier
        second = _failover("node-2", 10)
        choice = catalog.choose(second.exclude_nodes, world_size=WORLD)
        assert choice is not None and choice.step == 5, choice
        plan = plan_restore(second, catalog, world_size=WORLD)
        assert plan.step == 5
        sources = {s.rank: (s.tier, s.node) for s in plan.sources}
        assert sources == {
            0: ("local", "node-0"),
            1: ("local", "node-0"),
            2: ("durable", None),
            3: ("durable", None),
        }
        write_plan(plan, tmp_path / "plan.json")
        # the restore chooser the policy asks gives the same answer
        from faultlens.attribution.policy import RestoreRequest

        assert catalog(RestoreRequest(job_id="job", exclude_nodes=("node-2",))) == Restore(
            "local+durable", 5, None
        )
    finally:
        supervisor.close()


def test_an_excluded_nodes_storage_reached_through_another_tier_is_never_read(tmp_path):
    """The durable tier is configured on a directory that is node-1's local storage (an NFS export,
    a symlink): once node-1 is excluded, nothing in it is read, whatever tier lists it."""
    _attempt(tmp_path, {"node-0": 0, "node-1": 1}, [4])
    replica = tmp_path / "nodes" / "node-1" / "ckpt" / "replica"
    replica.mkdir()
    (tmp_path / "durable").symlink_to(replica, target_is_directory=True)
    _attempt(tmp_path, {"node-0": 0, "node-1": 1}, [8], durable_every=8)
    catalog = CheckpointCatalog(_tiers(tmp_path, ["node-0", "node-1"]))
    durable = [e for e in catalog.scan() if e.tier.kind is TierKind.DURABLE]
    assert [e.step for e in durable if e.complete] == [8]
    assert catalog.owners(durable[0]) == frozenset({"node-1"})
    assert catalog.choose(world_size=WORLD).step == 8  # node-1 in the job: fine to read
    # node-1 leaves: its local tier and the "durable" copy living on it are both gone; node-0 alone
    # cannot restore
    assert catalog.choose(["node-1"], world_size=WORLD) is None
    catalog.retire(["node-1"])
    assert catalog.choose(world_size=WORLD) is None
