"""Live, an exception's verdict waits for the other nodes' first reports, counted from when it was
seen.

A real `faultlens demo` run's software bug (tests/data/teardown/demo-software-bug: every rank of 2
nodes x 2 raises the same KeyError at step 36) is landed node by node into a real store and followed
by the real Follower, on a clock the test moves. In CI's suite the first node's reports once landed
seconds after their stamps (torchrun's error files stamp whole seconds, and a loaded collector reads
them late); the wait, counted from the stamp, had already run out, and live named that node
("crash-exception", 0.60) where a batch pass named the code. The family: either node first, its
reports landing 0.5 to 8 s after their stamps, the other node's up to 0.9 of the wait later. And its
counterpart: where the other node never reports (its ranks stuck in a collective, its agent
running), the first node is named once the wait has passed, not held back further.
"""

from __future__ import annotations

import datetime as dt
import glob
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from faultlens.attribution.engine import Engine
from faultlens.attribution.follow import Follower
from faultlens.attribution.incident import Incident
from tests.engine_rows import write

FIXTURE = Path(__file__).parent / "data" / "teardown" / "demo-software-bug"
POLL_S = 0.25  # the live follower's poll interval (rules/thresholds.yaml engine.poll_interval_s)


def _rows(table: str) -> list[dict]:
    (path,) = glob.glob(str(FIXTURE / table / "**" / "*.parquet"), recursive=True)
    return pq.read_table(path).to_pylist()


def _follow(tmp_path: Path, landings: list[tuple[float, list[dict]]], until: float, lag_s: float
            ) -> list[tuple[float, Incident]]:
    """Lands each (t, process_events rows) at t seconds on the test's clock (t=0: the first landing,
    `lag_s` after the newest stamp among its rows) and polls every POLL_S until `until`; returns (t,
    incident) for what the follower wrote."""
    store = tmp_path / "store"
    for table in ("ranks", "steps", "heartbeats"):
        write(store, table, _rows(table))
    events = _rows("process_events")
    write(store, "process_events", [r for r in events if r["kind"] == "start"])
    first = landings[0][1]
    base = max(r["ts"] for r in first) + dt.timedelta(seconds=lag_s)
    clock = {"t": 0.0}
    follower = Follower(
        str(store),
        engine=Engine(),
        clock=lambda: base + dt.timedelta(seconds=clock["t"]),
        monotonic=lambda: clock["t"],
        wall=lambda: base.timestamp() + clock["t"],
    )
    written: list[tuple[float, Incident]] = []
    pending = sorted(landings, key=lambda landing: landing[0])
    try:
        follower.poll_once()  # the attempt's start, before anything failed
        while clock["t"] <= until:
            while pending and pending[0][0] <= clock["t"]:
                write(store, "process_events", pending.pop(0)[1])
            written += [(clock["t"], incident) for incident in follower.poll_once()]
            clock["t"] += POLL_S
    finally:
        follower.close()
    return written


def _by_node(node: str) -> list[dict]:
    return [
        r
        for r in _rows("process_events")
        if r["node"] == node and r["kind"] not in ("start", "agent_exit")
    ]


def _agent_exits() -> list[dict]:
    return [r for r in _rows("process_events") if r["kind"] == "agent_exit"]


@pytest.mark.parametrize("first,second", [("node-2", "node-5"), ("node-5", "node-2")])
@pytest.mark.parametrize("lag_s", [0.5, 3.0, 8.0])
@pytest.mark.parametrize("skew", [0.3, 0.9])
def test_the_code_is_named_however_late_the_reports_land(
    tmp_path: Path, first: str, second: str, lag_s: float, skew: float
) -> None:
    wait = Engine().crash_rules.exception_peer_wait_s
    later = skew * wait
    written = _follow(tmp_path, [(0.0, _by_node(first)), (later, _by_node(second)),
                                 (later + 3.0, _agent_exits())], until=later + 4.0, lag_s=lag_s)
    assert len(written) == 1, [(t, i.rule, i.culprit_nodes) for t, i in written]
    _, incident = written[0]
    assert (incident.rule, incident.culprit_nodes, incident.culprit_ranks) == (
        "crash-software-same-fingerprint-multi-node", (), (0, 1, 2, 3))


@pytest.mark.parametrize("first,silent", [("node-2", "node-5"), ("node-5", "node-2")])
@pytest.mark.parametrize("lag_s", [0.5, 8.0])
def test_a_node_whose_peers_never_report_is_named_once_the_wait_has_passed(
    tmp_path: Path, first: str, silent: str, lag_s: float
) -> None:
    wait = Engine().crash_rules.exception_peer_wait_s
    written = _follow(tmp_path, [(0.0, _by_node(first))], until=wait + 3.0, lag_s=lag_s)
    assert len(written) == 1, [(t, i.rule, i.culprit_nodes) for t, i in written]
    t, incident = written[0]
    assert incident.culprit_nodes == (first,) and incident.rule.startswith("crash-"), incident
    # not before the wait, counted from when it was seen; and within a poll or two after it
    assert wait <= t <= wait + 2 * POLL_S + 1e-9, t
