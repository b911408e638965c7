"""The checkpoint catalog and restore choice over real directories: shard checkpoints with commit
manifests, a real torch.distributed.checkpoint directory, the durable tier on moto's real S3 server
through s3fs, and the tiered checkpointer."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Decision, Restore
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, load_policy
from faultlens.collectors.store.schema import rows_to_table
from faultlens.controller.checkpoints import (
    CheckpointCatalog,
    ChecksumStatus,
    Layout,
    Tier,
    TierKind,
    parse_tier_spec,
)
from faultlens.controller.checkpoints.manifest import Manifest, shard_entries
from faultlens.controller.checkpoints.tiered import TieredCheckpointer
from faultlens.controller.restore import (
    ENV_RESTORE_PLAN,
    RestoreHook,
    load_rank_state,
    load_restore_plan,
    plan_restore,
    read_source,
)

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def write_shards(root: Path, step: int, ranks: range | list[int], world_size: int, *,
                 created_at: dt.datetime | None = None, manifest: bool = True) -> Path:
    """A per-rank shard checkpoint as a writer leaves it: files first, the manifest last."""
    directory = root / f"step-{step:08d}"
    directory.mkdir(parents=True)
    files = {rank: (f"rank_{rank}.pt", f"rank {rank} step {step}".encode() * 10) for rank in ranks}
    for name, data in files.values():
        (directory / name).write_bytes(data)
    if manifest:
        (directory / "manifest.json").write_bytes(
            Manifest(step, world_size, shard_entries(files), created_at=created_at or T0).to_json())
    return directory


@pytest.fixture
def tiers(tmp_path: Path) -> dict[str, Tier]:
    return {
        "local0": Tier(TierKind.LOCAL, str(tmp_path / "node-0" / "local"), "node-0"),
        "local1": Tier(TierKind.LOCAL, str(tmp_path / "node-1" / "local"), "node-1"),
        "peer": Tier(TierKind.PEER, str(tmp_path / "node-0" / "peer-of-node-1"), "node-0"),
        "durable": Tier(TierKind.DURABLE, str(tmp_path / "durable")),
    }


def test_incomplete_newest_checkpoint_is_skipped(tiers: dict[str, Tier]) -> None:
    durable = Path(tiers["durable"].url)
    write_shards(durable, 200, range(4), 4)
    write_shards(durable, 300, range(3), 4, manifest=False)  # rank 3 never finished, no commit
    catalog = CheckpointCatalog([tiers["durable"]])
    entries = {e.step: e for e in catalog.scan()}
    assert entries[300].complete is False and "not committed" in entries[300].problem
    assert entries[200].complete is True
    choice = catalog.choose()
    assert (
        choice.step == 200
        and choice.tier == "durable"
        and choice.uri == str(durable / "step-00000200")
    )
    assert [s.uri for s in choice.sources] == [
        str(durable / "step-00000200" / f"rank_{r}.pt") for r in range(4)
    ]


def test_manifest_naming_a_missing_or_truncated_file_is_incomplete(tiers: dict[str, Tier]) -> None:
    durable = Path(tiers["durable"].url)
    write_shards(durable, 100, range(2), 2)
    missing = write_shards(durable, 200, range(2), 2)
    (missing / "rank_1.pt").unlink()
    truncated = write_shards(durable, 300, range(2), 2)
    (truncated / "rank_0.pt").write_bytes(b"short")
    catalog = CheckpointCatalog([tiers["durable"]])
    entries = {e.step: e for e in catalog.scan()}
    assert "rank_1.pt (rank 1) missing" in entries[200].problem
    assert "manifest says" in entries[300].problem
    assert catalog.choose().step == 100


def test_a_manifest_covering_only_some_ranks_is_not_enough(tiers: dict[str, Tier]) -> None:
    durable = Path(tiers["durable"].url)
    write_shards(durable, 100, range(4), 4)
    write_shards(durable, 200, range(2), 4)  # a committed manifest for ranks 0-1 only
    assert CheckpointCatalog([tiers["durable"]]).choose().step == 100


def test_newest_only_on_the_excluded_nodes_local_tier(tiers: dict[str, Tier]) -> None:
    for tier, ranks in (("local0", range(0, 2)), ("local1", range(2, 4))):
        write_shards(Path(tiers[tier].url), 300, ranks, 4)
    write_shards(Path(tiers["durable"].url), 200, range(4), 4)
    catalog = CheckpointCatalog([tiers["local0"], tiers["local1"], tiers["durable"]])
    assert catalog.choose().step == 300  # nobody leaves: the local tiers serve the newest
    choice = catalog.choose(exclude_nodes=["node-1"])
    assert choice.step == 200 and choice.tier == "durable"
    # with a peer replica of node-1's shards held on node-0, the newest step survives the exclusion
    write_shards(Path(tiers["peer"].url), 300, range(2, 4), 4)
    catalog = CheckpointCatalog(list(tiers.values()))
    choice = catalog.choose(exclude_nodes=["node-1"])
    assert choice.step == 300 and choice.tier == "local+peer" and choice.uri is None
    assert {s.rank: (s.tier, s.node) for s in choice.sources} == {
        0: (TierKind.LOCAL, "node-0"), 1: (TierKind.LOCAL, "node-0"),
        2: (TierKind.PEER, "node-0"), 3: (TierKind.PEER, "node-0")}
    # the peer replica lives on node-0: excluding node-0 as well leaves only the durable tier
    assert catalog.choose(exclude_nodes=["node-0", "node-1"]).tier == "durable"


def _corruption_incident(first_signal: dt.datetime, step: int) -> Incident:
    return Incident(
        "inc-sdc",
        IncidentClass.CRASH,
        Cause.DATA_CORRUPTION,
        first_signal,
        first_signal,
        0.9,
        "nan-loss",
        "loss became NaN",
        job_id="job-1",
        attempt=0,
        culprit_nodes=("node-1",),
        culprit_ranks=(2,),
        step=step,
    )


def test_corruption_class_incident_restores_from_before_the_incident(
    tiers: dict[str, Tier],
) -> None:
    durable = Path(tiers["durable"].url)
    write_shards(durable, 200, range(4), 4, created_at=T0)
    write_shards(durable, 300, range(4), 4, created_at=T0 + dt.timedelta(minutes=10))
    write_shards(durable, 400, range(4), 4, created_at=T0 + dt.timedelta(minutes=20))
    catalog = CheckpointCatalog([tiers["durable"]])
    incident = _corruption_incident(T0 + dt.timedelta(minutes=5), step=350)
    decision = DecisionPolicy(load_policy(), restore_chooser=catalog, clock=lambda: T0).decide(
        incident
    )
    assert decision.action is Action.FAILOVER
    assert decision.restore == Restore("durable", 200, str(durable / "step-00000200"))
    # a hardware incident at the same moment keeps the newest
    hardware = Incident(
        "inc-hw",
        IncidentClass.CRASH,
        Cause.GPU_HARDWARE,
        incident.first_signal_ts,
        incident.detected_ts,
        0.9,
        "xid-79",
        "x",
        job_id="job-1",
        culprit_nodes=("node-1",),
    )
    assert DecisionPolicy(load_policy(), restore_chooser=catalog,
                          clock=lambda: T0).decide(hardware).restore.step == 400
    # the step bound alone also applies (a checkpoint at or after the incident's step is never
    # taken)
    assert catalog.choose(before_step=300).step == 200


def test_checksum_mismatch_is_never_restored(tiers: dict[str, Tier]) -> None:
    durable = Path(tiers["durable"].url)
    write_shards(durable, 100, range(2), 2)
    bad = write_shards(durable, 200, range(2), 2)
    data = bytearray((bad / "rank_1.pt").read_bytes())
    data[0] ^= 0xFF  # same size, different content: only the checksum catches it
    (bad / "rank_1.pt").write_bytes(bytes(data))
    catalog = CheckpointCatalog([tiers["durable"]])
    assert catalog.choose().step == 100
    statuses = {e.step: catalog.status_of(e) for e in catalog.scan()}
    assert statuses == {200: ChecksumStatus.MISMATCH, 100: ChecksumStatus.VERIFIED}


def test_hostile_manifest_path_is_rejected(tiers: dict[str, Tier]) -> None:
    durable = Path(tiers["durable"].url)
    directory = durable / "step-00000100"
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps({
        "format": "faultlens.shards/1", "step": 100, "world_size": 1,
        "files": [{"rank": 0, "path": "../../etc/passwd", "bytes": 1, "sha256": "0" * 64}]}))
    entry = CheckpointCatalog([tiers["durable"]]).scan()[0]
    assert not entry.complete and "files[0].path" in entry.problem


@pytest.fixture(scope="module")
def dcp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real torch.distributed.checkpoint directory saved by torch (single process, no process
    group).
    """
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    root = tmp_path_factory.mktemp("dcp")
    state = {
        "model": {
            "weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "bias": torch.zeros(4),
        },
        "step": torch.tensor(400),
        "extra": {"lr": 0.1},
    }
    with warnings.catch_warnings():
        # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(root / "step-00000400"))
    return root / "step-00000400"


def _copy_tree(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


@pytest.mark.parametrize("use_torch", [True, False])
def test_real_dcp_directory_is_understood(
    dcp_checkpoint: Path, tmp_path: Path, use_torch: bool
) -> None:
    assert (dcp_checkpoint / ".metadata").exists() and list(dcp_checkpoint.glob("__0_*.distcp"))
    durable = tmp_path / "durable"
    _copy_tree(dcp_checkpoint, durable / "step-00000400")
    write_shards(durable, 300, range(2), 2)
    catalog = CheckpointCatalog([Tier(TierKind.DURABLE, str(durable))], use_torch=use_torch)
    entry = next(e for e in catalog.scan() if e.step == 400)
    assert entry.layout is Layout.DCP and entry.complete and entry.ranks is None
    choice = catalog.choose(world_size=2)
    assert (
        choice.step == 400
        and choice.layout is Layout.DCP
        and choice.uri == str(durable / "step-00000400")
    )
    assert {s.uri for s in choice.sources} == {str(durable / "step-00000400")}


def test_dcp_directory_with_a_truncated_or_missing_data_file(
    dcp_checkpoint: Path, tmp_path: Path
) -> None:
    durable = tmp_path / "durable"
    truncated = _copy_tree(dcp_checkpoint, durable / "step-00000400")
    data_file = next(truncated.glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    missing = _copy_tree(dcp_checkpoint, durable / "step-00000500")
    next(missing.glob("*.distcp")).unlink()
    uncommitted = _copy_tree(dcp_checkpoint, durable / "step-00000600")
    (uncommitted / ".metadata").unlink()
    entries = {
        e.step: e
        for e in CheckpointCatalog([Tier(TierKind.DURABLE, str(durable))], use_torch=True).scan()
    }
    assert not entries[400].complete and "metadata needs" in entries[400].problem
    assert not entries[500].complete and "missing" in entries[500].problem
    assert not entries[600].complete and ".metadata missing" in entries[600].problem


def test_hostile_dcp_metadata_never_runs_code(dcp_checkpoint: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    durable = tmp_path / "durable"
    hostile = _copy_tree(dcp_checkpoint, durable / "step-00000400")
    (hostile / ".metadata").write_bytes(pickle.dumps(Exploit(), protocol=2))
    entry = CheckpointCatalog([Tier(TierKind.DURABLE, str(durable))], use_torch=True).scan()[0]
    assert not entry.complete and "is not allowed" in entry.problem
    assert not marker.exists()


def test_catalog_rows_fit_the_checkpoints_table(tiers: dict[str, Tier]) -> None:
    write_shards(Path(tiers["local0"].url), 300, range(2), 2)
    write_shards(Path(tiers["durable"].url), 200, range(2), 2, manifest=False)
    catalog = CheckpointCatalog([tiers["local0"], tiers["durable"]], job_id="job-1")
    catalog.choose()
    table = rows_to_table("checkpoints", catalog.rows())
    rows = {r["step"]: r for r in table.to_pylist()}
    assert rows[300]["tier"] == "local" and rows[300]["node"] == "node-0" and rows[300]["complete"]
    assert rows[300]["checksum_status"] == "verified" and rows[300]["layout"] == "shards"
    assert (
        rows[200]["complete"] is False
        and rows[200]["node"] is None
        and rows[200]["job_id"] == "job-1"
    )


def test_tier_specs() -> None:
    assert parse_tier_spec("local@node-3=/nvme/ckpt") == Tier(
        TierKind.LOCAL, "/nvme/ckpt", "node-3"
    )
    assert parse_tier_spec("durable=s3://bucket/job").node is None
    with pytest.raises(ValueError, match="needs the node"):
        parse_tier_spec("local=/nvme")
    with pytest.raises(ValueError, match="expected local, peer or durable"):
        parse_tier_spec("tape=/dev/st0")


# --- restore plan
# --------------------------------------------------------------------------------------------


def _failover(restore: Restore | None, exclude: tuple[str, ...] = ("node-1",)) -> Decision:
    incident = Incident(
        "inc-1",
        IncidentClass.CRASH,
        Cause.GPU_HARDWARE,
        T0,
        T0,
        0.9,
        "xid-79",
        "x",
        job_id="job-1",
        culprit_nodes=exclude,
    )
    return Decision.for_incident(
        incident,
        action=Action.FAILOVER,
        policy_rule="hardware-failover",
        reason="x",
        issued_at=T0,
        exclude_nodes=exclude,
        restore=restore,
    )


def test_restore_hook_writes_the_plan_the_training_script_reads(
    tiers: dict[str, Tier], tmp_path: Path
) -> None:
    for tier, ranks in (("local0", range(0, 2)), ("local1", range(2, 4))):
        write_shards(Path(tiers[tier].url), 300, ranks, 4)
    write_shards(Path(tiers["peer"].url), 300, range(2, 4), 4)
    catalog = CheckpointCatalog(list(tiers.values()))
    decision = _failover(catalog(_request(("node-1",))))
    plan_file = tmp_path / "plan.json"
    RestoreHook(catalog, plan_file=str(plan_file)).deliver(decision, decision.to_json())
    plan = load_restore_plan({ENV_RESTORE_PLAN: str(plan_file)})
    assert plan.step == 300 and plan.tier == "local+peer" and plan.exclude_nodes == ("node-1",)
    assert plan.source_for(2) == str(Path(tiers["peer"].url) / "step-00000300" / "rank_2.pt")
    assert read_source(plan.source_for(2)) == b"rank 2 step 300" * 10
    assert load_restore_plan({}) is None


def _request(exclude: tuple[str, ...]):
    from faultlens.attribution.policy import RestoreRequest

    return RestoreRequest(job_id="job-1", exclude_nodes=exclude)


def test_restore_plan_falls_back_when_the_decided_checkpoint_is_gone(
    tiers: dict[str, Tier],
) -> None:
    durable = Path(tiers["durable"].url)
    write_shards(durable, 100, range(2), 2)
    gone = write_shards(durable, 200, range(2), 2)
    catalog = CheckpointCatalog([tiers["durable"]])
    decision = _failover(catalog(_request(("node-1",))))
    assert decision.restore.step == 200
    (gone / "manifest.json").unlink()
    assert plan_restore(decision, catalog).step == 100
    # an escalation restores nothing; a failover with no checkpoint starts from the beginning
    escalate = Decision.for_incident(
        Incident("inc-2", IncidentClass.CRASH, Cause.SOFTWARE, T0, T0, 0.9, "r", "s"),
        action=Action.ESCALATE,
        policy_rule="software-escalate",
        reason="x",
        issued_at=T0,
    )
    assert plan_restore(escalate, catalog) is None
    assert plan_restore(_failover(None), catalog).fresh_start


# --- durable tier on a real S3 API (moto server)
# ------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[dict]:
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": "us-east-1"},
    }
    import boto3

    boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket="ckpt")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield options
    finally:
        server.stop()


def test_tiered_checkpointer_with_durable_tier_on_s3(tmp_path: Path, s3: dict) -> None:
    import torch

    checkpointers = [
        TieredCheckpointer(
            local=str(tmp_path / f"node-{r}" / "local"),
            durable="s3://ckpt/job-1",
            storage_options=s3,
            rank=r,
            world_size=2,
            local_rank=0,
            local_world_size=1,
            node=f"node-{r}",
            every_local=1,
            every_durable=2,
            keep_local=2,
            commit_timeout_s=30,
        )
        for r in range(2)
    ]
    for step in range(1, 6):
        for c in checkpointers:
            c.save(step, {"w": torch.full((3,), float(step * 10 + c.rank)), "step": step})
    for c in checkpointers:
        c.close(timeout=60)
    assert [c.errors for c in checkpointers] == [[], []]

    tiers = [
        Tier(TierKind.LOCAL, str(tmp_path / f"node-{r}" / "local"), f"node-{r}") for r in range(2)
    ]
    tiers.append(Tier(TierKind.DURABLE, "s3://ckpt/job-1", None, tuple(sorted(s3.items()))))
    catalog = CheckpointCatalog(tiers)
    durable_steps = sorted(
        e.step for e in catalog.scan() if e.tier.kind is TierKind.DURABLE and e.complete
    )
    assert durable_steps == [2, 4]
    local_steps = sorted(
        {e.step for e in catalog.scan() if e.tier.kind is TierKind.LOCAL and e.complete}
    )
    # keep_local=2 keeps 4 and 5; step 2 goes once its durable copy is committed, which can finish
    # after the last local prune ran (a step is never pruned while its durable copy may still read
    # it)
    assert {4, 5} <= set(local_steps) <= {2, 4, 5}

    assert catalog.choose().step == 5
    choice = catalog.choose(exclude_nodes=["node-1"])
    assert choice.step == 4 and choice.tier == "local+durable"
    both = catalog.choose(exclude_nodes=["node-0", "node-1"])
    assert both.step == 4 and both.tier == "durable" and both.uri == "s3://ckpt/job-1/step-00000004"

    plan = plan_restore(_failover(both.to_restore(), ("node-0", "node-1")), catalog)
    assert plan.source_for(1) == "s3://ckpt/job-1/step-00000004/rank_1.pt"
    state = torch.load(io.BytesIO(read_source(plan.source_for(1), s3)), weights_only=True)
    assert state["step"] == 4 and torch.equal(state["w"], torch.full((3,), 41.0))
    mixed = plan_restore(_failover(choice.to_restore()), catalog)
    assert load_rank_state(mixed, 0, storage_options=s3)["step"] == 4  # from node-0's local tier
    # from S3
    assert torch.equal(load_rank_state(mixed, 1, storage_options=s3)["w"], torch.full((3,), 41.0))


# --- the tiered checkpointer never exposes an incomplete checkpoint
# --------------------------------------------


def _bytes_serializer(state, handle) -> None:
    time.sleep(0.01)  # widen the window between the ranks' writes
    handle.write(json.dumps(state).encode() * 200)


def test_a_rank_that_never_writes_leaves_the_checkpoint_incomplete(tmp_path: Path) -> None:
    local = tmp_path / "node-0" / "local"
    rank0 = TieredCheckpointer(
        local=str(local),
        rank=0,
        world_size=2,
        local_rank=0,
        local_world_size=2,
        node="node-0",
        commit_timeout_s=0.3,
        serialize=_bytes_serializer,
    )
    rank0.save(1, {"rank": 0})
    rank0.close(timeout=10)
    assert any("1 of 2 ranks committed" in e for e in rank0.errors)
    catalog = CheckpointCatalog([Tier(TierKind.LOCAL, str(local), "node-0")])
    entry = catalog.scan()[0]
    assert entry.complete is False and (local / "step-00000001" / "rank_0.pt").exists()
    assert catalog.choose() is None


def test_concurrent_observer_never_sees_an_incomplete_checkpoint_as_complete(
    tmp_path: Path,
) -> None:
    local = tmp_path / "node-0" / "local"
    durable = tmp_path / "durable"
    checkpointers = [
        TieredCheckpointer(
            local=str(local),
            durable=str(durable),
            rank=r,
            world_size=2,
            local_rank=r,
            local_world_size=2,
            node="node-0",
            every_local=1,
            every_durable=2,
            keep_local=0,
            serialize=_bytes_serializer,
        )
        for r in range(2)
    ]
    catalog = CheckpointCatalog(
        [Tier(TierKind.LOCAL, str(local), "node-0"), Tier(TierKind.DURABLE, str(durable))]
    )
    stop = threading.Event()
    seen: list[tuple[str, int, ChecksumStatus, frozenset | None]] = []

    def observe() -> None:
        while not stop.is_set():
            for entry in catalog.scan():
                if entry.complete:
                    seen.append((entry.tier.name, entry.step, catalog.verify(entry), entry.ranks))

    observer = threading.Thread(target=observe)
    observer.start()
    for step in range(1, 9):
        for c in checkpointers:
            c.save(step, {"rank": c.rank, "step": step})
    for c in checkpointers:
        c.close(timeout=30)
    stop.set()
    observer.join()
    assert seen, "the observer saw no complete checkpoint at all"
    assert all(
        status is ChecksumStatus.VERIFIED and ranks == frozenset({0, 1})
        for _, _, status, ranks in seen
    )
    final = {(e.tier.name, e.step) for e in catalog.scan() if e.complete}
    assert final == {("local@node-0", s) for s in range(1, 9)} | {
        ("durable", s) for s in (2, 4, 6, 8)
    }


def test_tiered_checkpointer_peer_replicas_survive_a_node_exclusion(tmp_path: Path) -> None:
    """2 nodes x 2 ranks; each node replicates its shards to the other node's storage every 2 steps.
    """
    checkpointers = []
    for rank in range(4):
        node, other = (f"node-{rank // 2}", f"node-{1 - rank // 2}")
        checkpointers.append(
            TieredCheckpointer(
                local=str(tmp_path / node / "local"),
                peer=str(tmp_path / other / f"peer-of-{node}"),
                rank=rank,
                world_size=4,
                local_rank=rank % 2,
                local_world_size=2,
                node=node,
                every_local=1,
                every_durable=2,
                keep_local=0,
                serialize=_bytes_serializer,
            )
        )
    for step in range(1, 6):
        for c in checkpointers:
            c.save(step, {"rank": c.rank, "step": step})
    for c in checkpointers:
        c.close(timeout=30)
    assert [c.errors for c in checkpointers] == [[]] * 4
    tiers = [
        Tier(TierKind.LOCAL, str(tmp_path / f"node-{n}" / "local"), f"node-{n}") for n in range(2)
    ]
    tiers += [
        Tier(TierKind.PEER, str(tmp_path / f"node-{1 - n}" / f"peer-of-node-{n}"), f"node-{1 - n}")
        for n in range(2)
    ]
    catalog = CheckpointCatalog(tiers)
    assert catalog.choose().step == 5 and catalog.choose().tier == "local"
    # node-0's ranks come back from their replica on node-1
    choice = catalog.choose(exclude_nodes=["node-0"])
    assert choice.step == 4 and choice.tier == "local+peer"
    assert {s.rank: s.node for s in choice.sources} == {
        0: "node-1",
        1: "node-1",
        2: "node-1",
        3: "node-1",
    }


def test_tiers_yaml_file(tmp_path: Path) -> None:
    from faultlens.controller.checkpoints import TierError, parse_tiers

    path = tmp_path / "tiers.yaml"
    path.write_text("format_version: 1\ntiers:\n  - {kind: local, node: node-0, url: /nvme/ckpt}\n"
                    "  - {kind: durable, url: 's3://bucket/job', storage_options: {anon: false}}\n")
    tiers = parse_tiers([str(path)])
    assert tiers[0] == Tier(TierKind.LOCAL, "/nvme/ckpt", "node-0")
    assert dict(tiers[1].storage_options) == {"anon": False}
    path.write_text("format_version: 1\ntiers:\n  - {kind: local, url: /nvme/ckpt}\n")
    with pytest.raises(TierError, match=r"tiers\[0\].*needs the node"):
        parse_tiers([str(path)])
    path.write_text("format_version: 1\ntiers:\n  - {kind: tape, url: /dev/st0}\n")
    with pytest.raises(TierError,
                       match=r"tiers\.yaml: tiers\[0\]\.kind: expected one of local, peer, "
                             r"durable, got 'tape'"):
        parse_tiers([str(path)])
