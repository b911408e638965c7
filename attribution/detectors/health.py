"""Health incidents: a critical GPU health event with no failure (yet) behind it, for a proactive
drain.

A row-remap failure, an uncorrectable ECC error, a GPU that fell off the bus, a recovery action that
asks for a reset or reboot, or an Xid whose catalog entry says the GPU or node must leave the job:
when no crash or hang incident on that node already accounts for it, it becomes one `health`
incident per GPU and day (the policy drains the node before the GPU fails a job). Which kinds and
recovery actions count comes from rules/thresholds.yaml (`health`); what an event means from
rules/crash.yaml and the XID catalog.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import pandas as pd

from faultlens.attribution.hardware import (
    XidCatalogLike,
    as_datetime,
    describe_gpu_event,
    hardware_cause,
)
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.rules import CrashRules, HealthThresholds


class HealthMonitor:
    """Critical GPU events not explained by a failure incident -> health incidents."""

    def __init__(
        self, thresholds: HealthThresholds, crash_rules: CrashRules, catalog: XidCatalogLike | None
    ) -> None:
        self.t = thresholds
        self.rules = crash_rules
        self.catalog = catalog

    def critical(self, events: pd.DataFrame) -> pd.DataFrame:
        """The rows of `events` that are critical by the thresholds (before any suppression)."""
        if events.empty:
            return events
        kind = events["kind"].astype(object)
        code = pd.to_numeric(events["code"].astype(object), errors="coerce").astype(float)
        mask = kind.isin(self.t.kinds) | (
            (kind == "recovery_action") & code.isin(self.t.recovery_actions)
        )
        if self.catalog is not None and "xid" in self.t.leave_xid_kinds:
            leaves = {
                int(c): str(
                    getattr(self.catalog.get(int(c)).leave, "value", self.catalog.get(int(c)).leave)
                )
                for c in code[kind == "xid"].dropna().unique()
            }
            leaving = [int(c) for c, scope in leaves.items() if scope in self.t.leave_scopes]
            mask |= (kind == "xid") & code.isin(leaving)
        return events[mask.to_numpy(dtype=bool)]

    def attribute(self, events: pd.DataFrame, failures: Iterable[Incident], now: dt.datetime,
                  settled_before: dt.datetime | None = None) -> list[Incident]:
        """Health incidents for critical events in `events`. `failures`: crash and hang incidents
        that may explain them (same node, within the crash rules' hardware window).
        `settled_before`: only events older than this (live mode: give the failure a moment to be
        reported first)."""
        rows = self.critical(events)
        if rows.empty:
            return []
        if settled_before is not None:
            rows = rows[rows["ts"] <= settled_before]
        window_before = dt.timedelta(seconds=self.rules.hardware_window.before_s)
        window_after = dt.timedelta(seconds=self.rules.hardware_window.after_s)
        explained: dict[str, list[dt.datetime]] = {}
        for incident in failures:
            if incident.incident_class in (IncidentClass.CRASH, IncidentClass.COLLECTIVE_HANG):
                for node in incident.culprit_nodes:
                    explained.setdefault(node, []).append(incident.first_signal_ts)
        incidents: dict[str, Incident] = {}
        gpu_key = (
            rows["gpu_uuid"]
            .astype(object)
            .where(rows["gpu_uuid"].notna(), rows["pci_bus_id"].astype(object))
        )
        rows = rows.assign(
            _gpu=gpu_key.where(gpu_key.notna(), None), _not_xid=rows["kind"] != "xid"
        )
        # an Xid before the kinds derived from it
        rows = rows.sort_values(["ts", "_not_xid"], kind="stable")
        for (node, gpu), group in rows.groupby(["node", rows["_gpu"].fillna("")], sort=True):
            node = str(node)
            events_here = []
            lines: set[tuple[object, object]] = set()
            for _, row in group.iterrows():
                ts = as_datetime(row["ts"])
                if ts is None or any(
                    t - window_after <= ts <= t + window_before for t in explained.get(node, [])
                ):
                    continue
                line = (
                    ts,
                    row.get("raw") if isinstance(row.get("raw"), str) else row.get("message"),
                )
                if line[1] is not None and line in lines:
                    # an Xid line also gives the event kind derived from it: one piece of evidence
                    continue
                lines.add(line)
                events_here.append((ts, row))
            if not events_here:
                continue
            first_ts, first = events_here[0]
            implied = hardware_cause(first, self.rules, self.catalog)
            cause = implied[0] if implied is not None else None
            info = implied[2] if implied is not None else None
            confidence = implied[1] if implied is not None else 0.7
            incident_id = Incident.make_id("health", node, gpu or None, first_ts.date().isoformat())
            if incident_id in incidents:
                continue
            evidence = tuple(
                Evidence("gpu_events", ts, describe_gpu_event(row, info if i == 0 else None))
                for i, (ts, row) in enumerate(events_here[: self.rules.evidence_limit])
            )
            job = first["job_id"] if isinstance(first.get("job_id"), str) else None
            incidents[incident_id] = Incident(
                incident_id=incident_id,
                incident_class=IncidentClass.HEALTH,
                cause=cause or Cause.GPU_HARDWARE,
                first_signal_ts=first_ts,
                detected_ts=now,
                confidence=round(confidence, 3),
                rule=f"health-{first['kind']}".replace("_", "-"),
                summary=f"health: {describe_gpu_event(first, info)} with no failure yet; drain "
                f"{node}",
                job_id=job,
                culprit_nodes=(node,),
                culprit_gpus=(gpu,) if gpu else (),
                evidence=evidence,
            )
        return list(incidents.values())
