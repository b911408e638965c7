"""`faultlens node-check NODE`: may a node serve jobs? Usable as Slurm's HealthCheckProgram (on the
node) or from a resume script (anywhere with scontrol and the store).

    since    the node's drain time (Slurm's Reason stamp), else its last check, else `window` ago
    fail     a failing GPU event (FAILING_KINDS: Xid, ECC, row remap, lost GPU) in the store since
             then, or NVML (where present: the real backend, or a recorded timeline) answering
             a lost GPU, a reset required, a volatile double-bit error, a pending or failed row
             remap or a recovery action: the node is drained (kept drained) with the reason
    repeat   the node fails (or was drained again) within `window` after its last return:
             kept drained, reason "repeat offender"; a repeat offender is never resumed here, a
             human returns it (`scontrol update nodename=N state=resume`)
    self-test  with `self_test` N: a gloo all_reduce across N local ranks (selftest.py) that
             fails or does not finish keeps the node out like a GPU event
    pass     nothing since (and the self-test, when asked, passed): a drained node is resumed
             with the reason

Each check is a row of the store's node_checks table, so fleet history can ask which nodes came
back and which failed again; the self-test's result is in the check's reason and output.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.gpu_backend import BackendUnavailable, GpuBackend, GpuLostError
from faultlens.collectors.store.layout import resolve_store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.slurm.commands import Slurm
from faultlens.controller.slurm.selftest import TIMEOUT_S, SelfTest, collective_self_test

#: gpu_events kinds that keep a node out (the XID catalog decides which Xids are fatal upstream;
#: here any Xid counts: a node just back from a drain has no benefit of the doubt)
FAILING_KINDS = ("xid", "sxid", "ecc_dbe", "remap_pending", "remap_failure", "gpu_lost")
REPEAT_REASON = "repeat offender"
_STAMP = re.compile(r"\s*\[[^@\]]*@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]\s*$")


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    REPEAT_OFFENDER = "repeat_offender"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class NodeCheck:
    node: str
    verdict: Verdict
    action: str
    since: dt.datetime
    events: int
    event_kinds: str
    returned: dt.datetime | None
    reason: str
    self_test: SelfTest | None = None

    def to_row(self, now: dt.datetime) -> dict:
        return {
            "ts": now,
            "node": self.node,
            "verdict": self.verdict.value,
            "action": self.action,
            "since_ts": self.since,
            "events": self.events,
            "event_kinds": self.event_kinds,
            "returned_ts": self.returned,
            "reason": self.reason,
        }


def drain_time(reason_field: str) -> dt.datetime | None:
    """When the node was drained: the `[user@YYYY-MM-DDTHH:MM:SS]` stamp scontrol adds to a
    Reason (the controller's local time)."""
    match = _STAMP.search(reason_field or "")
    if not match:
        return None
    return dt.datetime.fromisoformat(match.group(1)).astimezone(dt.UTC)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _history(store: Store, node: str) -> list[dict]:
    if not store.segments("node_checks"):
        return []
    return store.query(
        "SELECT ts, verdict, action FROM node_checks WHERE node = ? ORDER BY ts", [node]
    ).to_pylist()


def _events(store: Store, node: str, since: dt.datetime) -> list[dict]:
    if not store.segments("gpu_events"):
        return []
    marks = ", ".join("?" for _ in FAILING_KINDS)
    return store.query(
        f"SELECT ts, kind, code FROM gpu_events WHERE node = ? AND ts > ? AND kind IN ({marks}) "
        "ORDER BY ts",
        [node, since, *FAILING_KINDS],
    ).to_pylist()


def nvml_problems(backend: GpuBackend, wait_s: float = 0.2) -> tuple[str, ...] | None:
    """What NVML says of the node's GPUs now, one text per problem; None when NVML is not present
    here (no driver, no GPU: the store's events are then the only evidence)."""
    try:
        devices = backend.open()
    except BackendUnavailable:
        return None
    problems: list[str] = []
    try:
        for device in devices:
            try:
                reading = backend.sample(device)
            except GpuLostError as exc:
                problems.append(f"GPU {device.index} lost ({exc.reason})")
                continue
            values = reading.values
            found = [
                "reset required" if reading.reset_required else "",
                "double-bit ECC" if (values.get("ecc_dbe_volatile") or 0) > 0 else "",
                "row remap pending" if values.get("remap_pending") else "",
                "row remap failure" if values.get("remap_failure") else "",
                f"recovery action {values['recovery_action']}"
                if values.get("recovery_action")
                else "",
            ]
            problems += [f"GPU {device.index} {what}" for what in found if what]
        if backend.supports_events():
            for event in backend.wait_events(wait_s):
                if event.kind in FAILING_KINDS or (event.kind == "recovery_action" and event.code):
                    code = "" if event.code is None else f" {event.code}"
                    problems.append(f"GPU {event.gpu_index} {event.kind}{code}")
    finally:
        backend.close()
    return tuple(dict.fromkeys(problems))


def check_node(
    node: str,
    store_url: str,
    slurm: Slurm,
    *,
    window: dt.timedelta = dt.timedelta(days=7),
    act: bool = True,
    clock: Callable[[], dt.datetime] = _utc_now,
    gpus: GpuBackend | None = None,
    self_test: int = 0,
    self_test_timeout_s: float = TIMEOUT_S,
) -> NodeCheck:
    """Check `node`, act on Slurm (unless `act` is False) and record the check in the store;
    `gpus`: the node's NVML (or a recorded timeline), asked now when given; `self_test`: ranks of
    the collective self-test run here (0: none)."""
    now = clock()
    record = slurm.node(node)
    state = record.get("State", "")
    drained = "DRAIN" in state
    reason_field = record.get("Reason", "")
    resolve_store(store_url, create=True)  # a first check on a new cluster writes the first row
    store = Store(store_url)
    try:
        history = _history(store, node)
        returns = [r["ts"] for r in history if r["action"] == "resumed"]
        returned = returns[-1] if returns else None
        last_check = history[-1]["ts"] if history else None
        offender = bool(history) and history[-1]["verdict"] == Verdict.REPEAT_OFFENDER.value
        since = (drain_time(reason_field) if drained else None) or last_check or now - window
        events = _events(store, node, since)
    finally:
        store.close()
    kinds = ", ".join(
        sorted({f"{e['kind']} {e['code']}" if e["code"] is not None else e["kind"] for e in events})
    )
    nvml = nvml_problems(gpus) if gpus is not None else None
    test = collective_self_test(self_test, self_test_timeout_s) if self_test else None
    test_failed = test is not None and not test.ok
    failed_again = (
        returned is not None
        and ((drained and since >= returned) or bool(events) or bool(nvml) or test_failed)
        and now - returned <= window
    )
    if offender or (
        failed_again and (events or nvml or test_failed or _drained_by_faultlens(reason_field))
    ):
        verdict, why = Verdict.REPEAT_OFFENDER, REPEAT_REASON
        why += (
            f": failed again within {window} of its return at {returned:%Y-%m-%dT%H:%M:%SZ}"
            if returned is not None and not offender
            else ""
        )
    elif events:
        verdict = Verdict.FAIL
        why = (
            f"faultlens node-check: {len(events)} GPU event(s) since {since:%Y-%m-%dT%H:%M:%SZ}: "
            f"{kinds}"
        )
    elif nvml:
        verdict = Verdict.FAIL
        why = f"faultlens node-check: NVML: {'; '.join(nvml)}"
    elif test_failed:
        verdict = Verdict.FAIL
        why = f"faultlens node-check: self-test: {test.text()}"  # type: ignore[union-attr]
    else:
        verdict = Verdict.PASS
        why = (
            f"faultlens node-check: clean since {since:%Y-%m-%dT%H:%M:%SZ}"
            + (", NVML clean" if nvml is not None else "")
            + (f", self-test {test.text()}" if test is not None else "")
        )
    action = "none"
    if act:
        if verdict is Verdict.PASS:
            if drained:
                slurm.resume([node], why)
                action = "resumed"
        else:
            slurm.drain([node], why[:200])
            action = "kept_drained" if drained else "drained"
    check = NodeCheck(node, verdict, action, since, len(events), kinds, returned, why, test)
    sink = SegmentSink(store_url, flush_rows=1)
    try:
        sink.write("node_checks", [check.to_row(now)])
        sink.flush()
    finally:
        sink.close()
    return check


def _drained_by_faultlens(reason_field: str) -> bool:
    return reason_field.startswith("faultlens")
