"""Decision delivery: persist first, then hand the decision to every hook; at-least-once, status
recorded.

1. `submit(decision)` writes the decision to the decisions table (status pending, one row with no
   hook and one per configured hook) and flushes it into a visible segment BEFORE any hook is
   called; a decision already in the table is not written again (one decision per incident) and
   hooks that already have it are skipped.
2. Each hook is called with retries and exponential backoff (the hook's own RetryPolicy, or the
   deliverer's).
3. The outcome of each hook is appended as a row (delivered / failed, attempts, last error). The
   latest row per (decision_id, hook) wins. A failing hook never loses a decision: it stays
   pending/failed in the table and `redeliver()` (`faultlens deliver`) tries again. Receivers see
   duplicates (at-least-once) and recognise them by decision_id.
4. A decision the issuing supervisor carried out itself (`mark_applied`) gets a row with status
   applied (hook "supervisor"): it is never delivered again, by `redeliver()` or anyone.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from faultlens.attribution.decision import Decision, DecisionError, DeliveryStatus
from faultlens.collectors.store.layout import (
    StoreError,
    StoreLocation,
    list_segments,
    resolve_store,
)
from faultlens.collectors.store.native_read import open_segment
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.hooks.base import Hook, PermanentHookError, RetryPolicy

log = logging.getLogger(__name__)

#: the hook name of the row that marks a decision carried out by the supervisor that issued it
APPLIED_BY = "supervisor"


@dataclass(frozen=True)
class DeliveryResult:
    decision_id: str
    hook: str
    status: DeliveryStatus
    attempts: int
    error: str | None = None


@dataclass(frozen=True)
class DecisionRecord:
    """The latest state of one decision in the store: the decision and each hook's latest status."""

    decision: Decision
    hooks: dict[str, DeliveryStatus]
    errors: dict[str, str | None]
    persisted_ts: dt.datetime | None

    @property
    def applied(self) -> bool:
        return DeliveryStatus.APPLIED in self.hooks.values()

    @property
    def outrun(self) -> bool:
        return DeliveryStatus.OUTRUN in self.hooks.values()

    @property
    def status(self) -> DeliveryStatus:
        """applied when the supervisor carried it out; outrun when the job ended before it could;
        delivered when every hook has it; failed when any failed; pending otherwise (or with no
        hooks)."""
        if self.applied:
            return DeliveryStatus.APPLIED
        if self.outrun:
            return DeliveryStatus.OUTRUN
        if not self.hooks:
            return DeliveryStatus.PENDING
        values = set(self.hooks.values())
        if values == {DeliveryStatus.DELIVERED}:
            return DeliveryStatus.DELIVERED
        if DeliveryStatus.FAILED in values:
            return DeliveryStatus.FAILED
        return DeliveryStatus.PENDING


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class DecisionLog:
    """The decisions table: append rows (each flushed to a visible segment at once) and read the
    latest state.

    Reading is incremental: the log lists the table's segments and reads only those it has not seen
    (its own appends are merged as they are written), so the cost of a submit does not grow with the
    table's history. Segments written by other processes are picked up on the next read."""

    _COLUMNS = ("decision_id", "hook", "delivery_status", "delivery_error", "document", "ts")

    def __init__(
        self, store: str | StoreLocation, *, clock: Callable[[], dt.datetime] = _utc_now
    ) -> None:
        self.location = resolve_store(store, create=True)
        self.sink = SegmentSink(self.location, flush_rows=1_000_000, flush_age_s=3600.0)
        self.clock = clock
        self._last_ts: dt.datetime | None = None
        self._lock = threading.RLock()
        self._seen: set[str] = set()
        # (decision_id, hook) -> latest row
        self._latest: dict[tuple[str, str | None], dict[str, Any]] = {}
        self._documents: dict[str, Decision] = {}
        self._order: dict[str, dt.datetime] = {}  # decision_id -> first persisted ts

    def _ts(self) -> dt.datetime:
        """Row timestamps strictly increase within this log, so 'latest row wins' is well defined.
        """
        with self._lock:
            now = self.clock()
            if self._last_ts is not None and now <= self._last_ts:
                now = self._last_ts + dt.timedelta(microseconds=1)
            self._last_ts = now
            return now

    def _merge(self, row: dict[str, Any]) -> None:
        decision_id = row["decision_id"]
        if decision_id is None:
            return
        key = (decision_id, row["hook"])
        current = self._latest.get(key)
        if current is None or row["ts"] >= current["ts"]:
            self._latest[key] = {k: row.get(k) for k in self._COLUMNS}
        if decision_id not in self._documents and row.get("document"):
            try:
                self._documents[decision_id] = Decision.from_json(row["document"],
                                                                  source="decisions row "
                                                                         f"{decision_id}")
            except DecisionError as exc:
                log.warning("%s", exc)
        first = self._order.get(decision_id)
        if first is None or row["ts"] < first:
            self._order[decision_id] = row["ts"]

    def append(self, rows: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            self.sink.write("decisions", list(rows))
            for result in self.sink.flush("decisions"):
                self._seen.update(result.paths)
            for row in rows:
                self._merge(row)

    def _sync(self) -> None:
        """Read the segments written since the last read (by anyone)."""
        try:
            paths = list_segments(self.location, "decisions")
        except OSError as exc:
            raise StoreError(f"store {self.location.url!r}: cannot list decisions: {exc}") from None
        for path in paths:
            if path in self._seen:
                continue
            try:
                with open_segment(self.location, path) as handle:
                    parquet = pq.ParquetFile(handle)
                    # a segment of an older schema lacks new columns
                    present = set(parquet.schema_arrow.names)
                    table = parquet.read(columns=[c for c in self._COLUMNS if c in present])
            except FileNotFoundError:
                continue  # compacted away under us: its rows are in the compacted segment
            except (OSError, pa.ArrowException) as exc:
                log.warning("decisions segment %s: unreadable, skipped: %s", path, exc)
                continue
            for row in table.to_pylist():
                self._merge({column: row.get(column) for column in self._COLUMNS})
            self._seen.add(path)

    def persist(self, decision: Decision, hook_names: Sequence[str]) -> tuple[Decision, list[str]]:
        """Write the decision (pending) unless it is already in the table; add a pending row for
        every hook that has none yet. Returns the decision as persisted (the first one written for
        that incident stays its decision) and the hooks still to deliver to. Flushed before it
        returns."""
        with self._lock:
            self._sync()
            existing = self._record(decision.decision_id)
            rows = []
            if existing is None:
                rows.append(
                    decision.to_row(status=DeliveryStatus.PENDING, hook=None, ts=self._ts())
                )
                known: dict[str, DeliveryStatus] = {}
            else:
                decision = existing.decision
                known = existing.hooks
            for name in hook_names:
                if name not in known:
                    rows.append(
                        decision.to_row(status=DeliveryStatus.PENDING, hook=name, ts=self._ts())
                    )
            if rows:
                self.append(rows)
            return decision, [
                name for name in hook_names if known.get(name) is not DeliveryStatus.DELIVERED
            ]

    def mark_applied(
        self, decision: Decision, *, by: str = APPLIED_BY, note: str | None = None,
        status: DeliveryStatus = DeliveryStatus.APPLIED,
    ) -> None:
        """The decision was carried out by `by` (the supervisor that issued it): persisted if it was
        not, then an applied row; it is never delivered again. `status` OUTRUN: the job ended
        before `by` could carry it out (never delivered either)."""
        with self._lock:
            self.persist(decision, [])
            row = decision.to_row(status=status, hook=by, ts=self._ts())
            if note is not None:
                row["reason"] = f"{decision.reason}; {note}"
            self.append([row])

    def record(self, decision: Decision, result: DeliveryResult) -> None:
        row = decision.to_row(status=result.status, hook=result.hook, ts=self._ts())
        row["delivery_error"] = result.error
        row["delivery_attempts"] = result.attempts
        self.append([row])

    def _record(self, decision_id: str) -> DecisionRecord | None:
        decision = self._documents.get(decision_id)
        if decision is None:
            return None
        hooks: dict[str, DeliveryStatus] = {}
        errors: dict[str, str | None] = {}
        for (row_id, hook), row in self._latest.items():
            if row_id != decision_id or hook is None:
                continue
            try:
                hooks[hook] = DeliveryStatus(row["delivery_status"])
            except ValueError:
                hooks[hook] = DeliveryStatus.UNKNOWN
            errors[hook] = row["delivery_error"]
        return DecisionRecord(decision, hooks, errors, self._order.get(decision_id))

    def records(self, decision_ids: Sequence[str] | None = None) -> dict[str, DecisionRecord]:
        """decision_id -> its latest state, in the order decisions were first persisted."""
        with self._lock:
            self._sync()
            ids = (
                decision_ids
                if decision_ids is not None
                else sorted(self._documents, key=lambda i: self._order[i])
            )
            records = {}
            for decision_id in ids:
                record = self._record(decision_id)
                if record is not None:
                    records[decision_id] = record
            return records

    def close(self) -> None:
        self.sink.close()


class Deliverer:
    """Persist-then-deliver to a set of hooks. `sleep` and `clock` are boundaries (tests pass fast
    ones).
    """

    def __init__(self, store: str | StoreLocation | DecisionLog, hooks: Sequence[Hook], *,
                 retry: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], dt.datetime] = _utc_now) -> None:
        self.log = store if isinstance(store, DecisionLog) else DecisionLog(store, clock=clock)
        names = [hook.name for hook in hooks]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"hook names must be unique: {', '.join(sorted(duplicates))}")
        self.hooks = list(hooks)
        self.retry = retry or RetryPolicy()
        self.sleep = sleep

    def submit(self, decision: Decision) -> list[DeliveryResult]:
        """Persist `decision` (before anything else), then deliver it to every hook that does not
        have it.
        """
        persisted, todo = self.log.persist(decision, [hook.name for hook in self.hooks])
        return [self._deliver(hook, persisted) for hook in self.hooks if hook.name in todo]

    def mark_applied(
        self, decision: Decision, *, by: str = APPLIED_BY, note: str | None = None
    ) -> None:
        self.log.mark_applied(decision, by=by, note=note)

    def mark_outrun(
        self, decision: Decision, *, by: str = APPLIED_BY, note: str | None = None
    ) -> None:
        """Stored as outrun: the job ended before `by` could carry it out; never delivered."""
        self.log.mark_applied(decision, by=by, note=note, status=DeliveryStatus.OUTRUN)

    def redeliver(self) -> list[DeliveryResult]:
        """Retry every (decision, hook) whose latest status is pending or failed; a decision that
        never reached any hook (persisted without hooks, or the process died in between) goes to
        every configured hook."""
        results = []
        by_name = {hook.name: hook for hook in self.hooks}
        for record in self.log.records().values():
            if record.applied or record.outrun:
                continue  # carried out by the supervisor that issued it: never delivered again
            if record.hooks:
                targets = [name for name, status in record.hooks.items()
                           if status is not DeliveryStatus.DELIVERED and name in by_name]
            else:
                targets = list(by_name)
                self.log.persist(record.decision, targets)
            for name in targets:
                results.append(self._deliver(by_name[name], record.decision))
        return results

    def _deliver(self, hook: Hook, decision: Decision) -> DeliveryResult:
        policy = getattr(hook, "retry", None) or self.retry
        document = decision.to_json()
        delays = policy.delays()
        attempts = 0
        error: str | None = None
        while True:
            attempts += 1
            try:
                hook.deliver(decision, document)
            except PermanentHookError as exc:
                error = f"{type(exc).__name__}: {exc}"
                break
            # a hook's failure never loses the decision: record it, retry later
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                delay = next(delays, None)
                if delay is None:
                    break
                log.info(
                    "hook %s, decision %s: attempt %d failed (%s); retrying in %.2fs",
                    hook.name,
                    decision.decision_id,
                    attempts,
                    error,
                    delay,
                )
                self.sleep(delay)
                continue
            result = DeliveryResult(
                decision.decision_id, hook.name, DeliveryStatus.DELIVERED, attempts
            )
            self.log.record(decision, result)
            return result
        log.warning(
            "hook %s, decision %s: failed after %d attempt(s): %s",
            hook.name,
            decision.decision_id,
            attempts,
            error,
        )
        result = DeliveryResult(
            decision.decision_id, hook.name, DeliveryStatus.FAILED, attempts, error
        )
        self.log.record(decision, result)
        return result

    def close(self) -> None:
        self.log.close()
