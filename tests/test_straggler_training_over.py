"""A slowdown's failover is not carried out once every rank has finished training (issue 33): the
supervisor reads each rank's heartbeat file of the attempt (the step timer's own record, real
HeartbeatWriter files) and the training is over only when every rank's is closed and there are as
many as the job's world size. Under load a 70-step job trained in 12 s after a 76 s start and the
failover came 4 s after its last step: stopping it then would have trained it again from scratch."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.collectors.training.heartbeat import HeartbeatWriter
from faultlens.controller.supervisor.watch import _timers_closed


def _writers(attempt: Path, nodes: int, per_node: int) -> list[HeartbeatWriter]:
    writers = []
    for node in range(nodes):
        for local in range(per_node):
            rank = node * per_node + local
            path = attempt / "heartbeats" / f"node-{node}" / f"hb-{rank}.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            writers.append(HeartbeatWriter(path, {"rank": rank, "node": f"node-{node}"}))
    return writers


@pytest.mark.parametrize(("nodes", "per_node"), [(2, 2), (1, 1), (3, 4)])
def test_training_is_over_only_when_every_ranks_timer_closed(
    tmp_path: Path, nodes: int, per_node: int
) -> None:
    world = nodes * per_node
    assert not _timers_closed(tmp_path, world)  # no heartbeat yet: not over
    writers = _writers(tmp_path, nodes, per_node)
    assert all(w.active for w in writers)
    for writer in writers[:-1]:
        writer.close()
        assert not _timers_closed(tmp_path, world)
    writers[-1].close()
    assert _timers_closed(tmp_path, world)
    # fewer ranks than the job's world have reported: not over
    assert not _timers_closed(tmp_path, world + 1)


def test_an_unreadable_heartbeat_is_not_over(tmp_path: Path) -> None:
    writers = _writers(tmp_path, 1, 2)
    for writer in writers:
        writer.close()
    (tmp_path / "heartbeats" / "node-0" / "hb-1.bin").write_bytes(b"torn")
    assert not _timers_closed(tmp_path, 2)
