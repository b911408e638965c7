"""`faultlens serve`: the always-on attribution service of a cluster. One process follows every job
in the store (attribution/follow.py Follower), decides each new incident (the decision policy) and
delivers the decision to the hooks (controller/delivery.py), and serves /metrics for Prometheus.

Safe to kill -9 at any moment: incidents, decisions and deliveries are rows in the store, ids are
deterministic, and every pass starts from what the store says. On start and every `catch_up_s` the
service decides the incidents that have no decision (killed between the incident and its decision)
and redelivers the decisions some hook has not acknowledged (killed before the delivery row); hooks
are idempotent by decision id, so at-least-once delivery applies each decision once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from faultlens.attribution.decision import DeliveryStatus
from faultlens.attribution.follow import Follower
from faultlens.attribution.incident import Incident
from faultlens.attribution.policy import DecisionPolicy
from faultlens.attribution.reading.queries import decided_incident_ids, incident_rows
from faultlens.attribution.reading.store import Store
from faultlens.controller.delivery import Deliverer, DeliveryResult
from faultlens.controller.hooks.base import Hook

log = logging.getLogger(__name__)


class ServiceMetrics:
    """The service's Prometheus metrics, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.polls = Counter("faultlens_serve_polls", "Follower polls", registry=r)
        self.poll_errors = Counter("faultlens_serve_poll_errors", "Passes that failed", registry=r)
        self.incidents = Counter(
            "faultlens_serve_incidents", "Incidents written", ["incident_class"], registry=r
        )
        self.decisions = Counter(
            "faultlens_serve_decisions", "Decisions made", ["action"], registry=r
        )
        self.deliveries = Counter(
            "faultlens_serve_deliveries", "Delivery outcomes", ["hook", "status"], registry=r
        )
        self.last_poll = Gauge(
            "faultlens_serve_last_poll_timestamp_seconds",
            "When the last pass finished (Unix time)",
            registry=r,
        )
        self.lag = Gauge(
            "faultlens_serve_incident_lag_seconds",
            "Evidence visible -> incident visible, the newest incident",
            registry=r,
        )
        self.undelivered = Gauge(
            "faultlens_serve_undelivered_decisions",
            "Decisions some hook has not acknowledged",
            registry=r,
        )
        self.up = Gauge("faultlens_serve_up", "1 while the service runs", registry=r)


@dataclass(frozen=True)
class PassResult:
    incidents: int
    decisions: int
    deliveries: tuple[DeliveryResult, ...]


class Service:
    def __init__(
        self,
        store: str,
        hooks: Sequence[Hook],
        policy: DecisionPolicy | Callable[[Store], DecisionPolicy],
        *,
        interval_s: float = 2.0,
        catch_up_s: float = 30.0,
        metrics: ServiceMetrics | None = None,
        follower: Follower | None = None,
    ) -> None:
        self.store_url = store
        self.follower = follower or Follower(store)
        self.deliverer = Deliverer(store, hooks)
        self._policy = policy
        self.interval_s = interval_s
        self.catch_up_s = catch_up_s
        self.metrics = metrics or ServiceMetrics()
        self._stop = threading.Event()
        self._last_catch_up = float("-inf")

    def _decide(self, incidents: Sequence[Incident], store: Store) -> list[DeliveryResult]:
        policy = self._policy if isinstance(self._policy, DecisionPolicy) else self._policy(store)
        decided = decided_incident_ids(store)
        results: list[DeliveryResult] = []
        for incident in incidents:
            if incident.incident_id in decided:
                continue
            decision = policy.decide(incident)
            self.metrics.decisions.labels(decision.action.value).inc()
            results += self.deliverer.submit(decision)
            decided.add(incident.incident_id)
        return results

    def pass_once(self) -> PassResult:
        """One follower poll, then decide and deliver; every `catch_up_s` also the incidents with
        no decision and the decisions not delivered."""
        new = self.follower.poll_once()
        self.metrics.polls.inc()
        for incident in new:
            self.metrics.incidents.labels(incident.incident_class.value).inc()
        lags = [r.lag_s for r in self.follower.stats.lag if r.lag_s is not None]
        if lags:
            self.metrics.lag.set(lags[-1])
        catch_up = time.monotonic() - self._last_catch_up >= self.catch_up_s
        if not new and not catch_up:
            self.metrics.last_poll.set_to_current_time()
            return PassResult(0, 0, ())
        store = Store(self.store_url)
        try:
            if catch_up:
                todo = [Incident.from_row(row) for row in incident_rows(store)]
            else:
                todo = list(new)
            results = self._decide(todo, store)
        finally:
            store.close()
        if catch_up:
            results += self.deliverer.redeliver()
            self._last_catch_up = time.monotonic()
            records = self.deliverer.log.records().values()
            self.metrics.undelivered.set(
                sum(
                    1
                    for r in records
                    if r.status in (DeliveryStatus.PENDING, DeliveryStatus.FAILED)
                )
            )
        for result in results:
            self.metrics.deliveries.labels(result.hook, result.status.value).inc()
        self.metrics.last_poll.set_to_current_time()
        return PassResult(len(new), sum(1 for _ in results), tuple(results))

    def run(self, *, max_passes: int | None = None) -> None:
        self.metrics.up.set(1)
        passes = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.pass_once()
            except Exception:  # one bad pass never stops the service; the next starts over
                self.metrics.poll_errors.inc()
                log.exception("faultlens serve: pass failed")
            passes += 1
            if max_passes is not None and passes >= max_passes:
                break
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        self.metrics.up.set(0)

    def serve_metrics(self, port: int, addr: str = "127.0.0.1"):
        """Start the /metrics endpoint (a daemon thread); returns the server."""
        server, _thread = start_http_server(port, addr=addr, registry=self.metrics.registry)
        return server

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop()
        self.follower.close()
        self.deliverer.close()
