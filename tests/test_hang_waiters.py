"""The ranks whose own exits say they waited (a collective's timeout, a survivor's echo) are handed
to the hang analysis, so that a missing dump of one is never read as a culprit by absence; a rank
told to stop, or one that raised its own error, is not among them."""

from __future__ import annotations

import pyarrow as pa

from faultlens.attribution.detectors.progress.dumps import waiting_ranks
from faultlens.attribution.rules import load_crash_rules
from faultlens.collectors.store.schema import schema_for

# what gloo and NCCL ranks print when their peer never came (torch 2.x texts)
GLOO_TIMEOUT = (
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 180000ms "
    "for recv operation to complete"
)
NCCL_WATCHDOG = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600105 milliseconds "
    "before timing out."
)


def _events(rows: list[dict]):
    """process_events as the engine's telemetry holds them (a frame of the table's schema)."""
    schema = schema_for("process_events")
    full = [{name: row.get(name) for name in schema.names} for row in rows]
    return pa.Table.from_pylist(full, schema=schema).to_pandas()


def test_timeouts_and_echoes_wait_a_termination_and_an_own_error_do_not() -> None:
    rules = load_crash_rules()
    table = _events([
        {"rank": 0, "attempt": 0, "kind": "exception", "message": GLOO_TIMEOUT},
        {"rank": 1, "attempt": 0, "kind": "exception", "message": NCCL_WATCHDOG},
        {"rank": 3, "attempt": 0, "kind": "exception", "message": "Connection reset by peer",
         "is_secondary": True},
        {"rank": 4, "attempt": 0, "kind": "signal",
         "message": "torch.distributed.elastic.multiprocessing.api.SignalException: Process 77 got "
                    "signal: 15", "is_secondary": True},
        {"rank": 5, "attempt": 0, "kind": "exception", "message": "ValueError: bad batch"},
        {"rank": 6, "attempt": 1, "kind": "exception", "message": GLOO_TIMEOUT},
    ])
    assert waiting_ranks(table, 0, rules) == {0, 1, 3}
    assert waiting_ranks(table, 1, rules) == {6}
    assert waiting_ranks(table.iloc[0:0], 0, rules) == frozenset()
