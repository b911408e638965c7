"""Alertmanager hook (`type: alertmanager`): page a human through an Alertmanager-compatible
receiver's v2 alerts API (POST <url>/api/v2/alerts). Only the actions that need a human are sent
(escalate and drain by default); the others are delivered as nothing to page.

The alert's labels identify it (alertname, job, nodes, action, decision_id): Alertmanager keeps one
alert per label set, so a decision delivered twice is one page. Its annotations carry what, where
and why, and the command that shows the incident.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from collections.abc import Iterable

from faultlens.attribution.decision import Action, Decision
from faultlens.controller.hooks.base import HookError, PermanentHookError, RetryPolicy

PAGED_ACTIONS = frozenset({Action.ESCALATE, Action.DRAIN})
ALERT_NAMES = {
    Action.ESCALATE: "FaultlensEscalation",
    Action.DRAIN: "FaultlensNodeDrain",
    Action.FAILOVER: "FaultlensFailover",
    Action.RESTART: "FaultlensRestart",
    Action.NOTIFY: "FaultlensNotice",
}
MAX_RESPONSE = 64 * 1024


def alert_for(
    decision: Decision,
    *,
    store: str | None = None,
    resolve_after: dt.timedelta = dt.timedelta(hours=24),
) -> dict:
    """The v2 alert of one decision."""
    nodes = ",".join(decision.exclude_nodes or decision.culprit.nodes) or "-"
    ranks = ",".join(str(r) for r in decision.culprit.ranks) or "-"
    gpus = ",".join(decision.culprit.gpus) or "-"
    store_arg = f" --store {store}" if store else ""
    labels = {
        "alertname": ALERT_NAMES.get(decision.action, "FaultlensDecision"),
        "severity": "page" if decision.action is Action.ESCALATE else "warning",
        "action": decision.action.value,
        "job": decision.job_id or "-",
        "nodes": nodes,
        "cluster": decision.cluster or "-",
        "decision_id": decision.decision_id,
        "incident_class": decision.incident_class.value,
        "cause": decision.cause.value,
    }
    annotations = {
        "summary": (
            f"{decision.action.value}: {decision.incident_class.value} "
            f"({decision.cause.value}) in job {decision.job_id or '-'}"
        ),
        "what": f"{decision.incident_class.value}, cause {decision.cause.value}, confidence "
        f"{decision.confidence:.2f}",
        "where": f"job {decision.job_id or '-'} attempt {decision.attempt}, nodes {nodes}, "
        f"ranks {ranks}, GPUs {gpus}",
        "why": decision.reason,
        "command": f"faultlens incident{store_arg} {decision.incident_id}",
        "incident_id": decision.incident_id,
    }
    starts = decision.issued_at.astimezone(dt.UTC)
    return {
        "labels": labels,
        "annotations": annotations,
        "startsAt": starts.isoformat().replace("+00:00", "Z"),
        "endsAt": (starts + resolve_after).isoformat().replace("+00:00", "Z"),
    }


class AlertmanagerHook:
    def __init__(
        self,
        url: str,
        *,
        name: str = "alertmanager",
        actions: Iterable[Action | str] = PAGED_ACTIONS,
        store: str | None = None,
        timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"alertmanager hook {name}: url {url!r} is not http(s)")
        self.url = url.rstrip("/")
        self.name = name
        self.actions = frozenset(Action(a) for a in actions)
        self.store = store
        self.timeout_s = timeout_s
        self.retry = retry

    def deliver(self, decision: Decision, document: str) -> None:
        if decision.action not in self.actions:
            return  # nothing for a human to do: delivered as no page
        body = json.dumps([alert_for(decision, store=self.store)]).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read(MAX_RESPONSE)
        except urllib.error.HTTPError as exc:
            text = exc.read(2000).decode("utf-8", "replace").strip()[:300]
            error = PermanentHookError if 400 <= exc.code < 500 else HookError
            raise error(f"{self.url}: HTTP {exc.code}: {text}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise HookError(f"{self.url}: {reason}") from None
