"""Scores one scenario run against its truth, from what the run left: the store (incidents,
decisions, steps), the restore plans the supervisor wrote with the checkpoint tiers as they were at
that moment, the injection log (where and when each fault landed, wall clock) and the supervisor's
exit status.

The expected restore step is computed here from the checkpoint directories themselves (manifests),
not through the catalog under test: the newest step whose every rank's shard is in the durable tier
or in the local tier of a node not excluded so far, and from before the first bad step when the data
is corrupt.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faultlens.controller.lab.plan import AMBIENT_KINDS, FaultSpec, read_injections
from faultlens.controller.lab.runner import RunArtifacts
from faultlens.controller.lab.scenarios import ExpectedIncident, Scenario, cause_family


@dataclass(frozen=True)
class Observed:
    incident_id: str
    attempt: int | None
    incident_class: str
    cause: str
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    confidence: float | None
    rule: str | None
    detected_ts: float | None
    action: str | None = None
    exclude: tuple[str, ...] = ()
    issued_ts: float | None = None
    restore_step: int | None = None


@dataclass(frozen=True)
class Check:
    """One expected incident against what was seen (None: not applicable)."""

    expected: str
    observed: str
    class_ok: bool
    culprit_node_ok: bool | None
    culprit_rank_ok: bool | None
    cause_ok: bool
    action_ok: bool
    latency_incident_s: float | None
    latency_decision_s: float | None


@dataclass(frozen=True)
class ScenarioScore:
    name: str
    fault_type: str
    healthy: bool
    cpu_hog: bool
    latency_class: str  # crash, node_loss, hang, slowdown, data, healthy
    checks: tuple[Check, ...]
    incidents: tuple[Observed, ...]
    incident_count_ok: bool
    excluded: tuple[str, ...]
    healthy_excluded: tuple[str, ...]
    failovers: int
    software_refailover: bool
    restore_ok: bool | None
    restores: tuple[str, ...]
    resumed_ok: bool | None
    finished: bool
    finished_ok: bool
    rc: int | None
    timed_out: bool
    wall_s: float
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    try:
        import pandas as pd

        if pd.isna(value):
            return None
        return pd.Timestamp(value).timestamp()
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    try:
        return None if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return None


def read_observed(store: Path, job_id: str) -> tuple[list[Observed], dict[int, tuple[int, int]]]:
    """The job's incidents with their decisions (first row of each decision), oldest first; and per
    attempt (first, last) train step."""
    from faultlens.attribution.reading.store import Store

    if not store.exists():
        return [], {}
    with Store(str(store)) as reader:
        incidents = reader.read_table("incidents", "job_id = ?", [job_id]).to_pylist()
        decisions = reader.read_table("decisions", "job_id = ?", [job_id]).to_pylist()
        steps = reader.query(
            "SELECT attempt, min(step) AS first, max(step) AS last FROM steps "
            "WHERE job_id = ? AND phase = 'train' GROUP BY attempt",
            [job_id],
        ).to_pylist()
    by_incident: dict[str, dict[str, Any]] = {}
    for row in sorted(decisions, key=lambda r: _ts(r.get("issued_ts")) or 0.0):
        by_incident.setdefault(row["incident_id"], row)
    # a decision the job outran was never carried out: scored as such, excluding nothing
    outrun = {r["decision_id"] for r in decisions if r.get("delivery_status") == "outrun"}
    for incident_id, row in list(by_incident.items()):
        if row["decision_id"] in outrun:
            by_incident[incident_id] = {**row, "action": f"{row['action']} (outrun)",
                                        "exclude_nodes": []}
    seen: dict[str, Observed] = {}
    for row in sorted(incidents, key=lambda r: _ts(r.get("detected_ts")) or 0.0):
        if row["incident_id"] in seen:
            continue
        decision = by_incident.get(row["incident_id"], {})
        seen[row["incident_id"]] = Observed(
            incident_id=row["incident_id"],
            attempt=_int(row.get("attempt")),
            incident_class=str(row.get("class")),
            cause=str(row.get("cause")),
            nodes=tuple(row.get("culprit_nodes") or ()),
            ranks=tuple(int(r) for r in row.get("culprit_ranks") or ()),
            confidence=row.get("confidence"),
            rule=row.get("rule"),
            detected_ts=_ts(row.get("detected_ts")),
            action=decision.get("action"),
            exclude=tuple(decision.get("exclude_nodes") or ()),
            issued_ts=_ts(decision.get("issued_ts")),
            restore_step=_int(decision.get("restore_step")),
        )
    attempt_steps = {
        int(r["attempt"]): (int(r["first"]), int(r["last"]))
        for r in steps
        if r["attempt"] is not None
    }
    return list(seen.values()), attempt_steps


def expected_restore(checkpoints: Sequence[Mapping[str, Any]], world: int, excluded: set[str],
                     before_step: int | None) -> int | None:
    """The newest step every rank can be restored from without an excluded node (and before
    `before_step`).
    """
    have: dict[int, set[int]] = {}
    for ckpt in checkpoints:
        if ckpt["tier"] == "local" and ckpt.get("node") in excluded:
            continue
        if before_step is not None and ckpt["step"] >= before_step:
            continue
        have.setdefault(int(ckpt["step"]), set()).update(ckpt["ranks"])
    full = [step for step, ranks in have.items() if ranks >= set(range(world))]
    return max(full) if full else None


def _targeted(spec: FaultSpec | None) -> bool:
    return spec is not None and any(
        v is not None for v in (spec.rank, spec.node, spec.node_rank, spec.local_rank)
    )


def _injections_by_attempt(
    lab_dir: Path, faults: Mapping[str, FaultSpec]
) -> dict[int, list[dict[str, Any]]]:
    """Per attempt, the landed faults, earliest first: the campaign's own line for an external fault
    (the moment it acted), the process's line otherwise."""
    rows = read_injections(lab_dir)
    acted = {(r["fault"], r["attempt"]) for r in rows if r.get("by") == "campaign"}
    out: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if (
            row.get("by") == "worker"
            and row.get("detail") == "trigger"
            and (row["fault"], row["attempt"]) in acted
        ):
            continue
        if faults.get(row["fault"]) is not None and faults[row["fault"]].kind in AMBIENT_KINDS:
            continue
        out.setdefault(int(row.get("attempt") or 0), []).append(row)
    for rows_of in out.values():
        rows_of.sort(key=lambda r: r["ts"])
    return out


def latency_class(scenario: Scenario) -> str:
    kinds = {f.kind for f in scenario.faults}
    if scenario.truth.healthy:
        return "healthy"
    first = scenario.truth.incidents[0]
    if kinds & {"node_loss", "agent_loss"}:
        return "node_loss"
    if first.incident_class == "collective_hang":
        return "hang"
    if first.incident_class == "straggler":
        return "slowdown"
    if kinds & {"nan", "loss_spike"}:
        return "data"
    return "crash"


def _check(expected: ExpectedIncident, observed: Observed | None, landed: list[dict[str, Any]],
           faults: Mapping[str, FaultSpec]) -> Check:
    want = f"{expected.incident_class}/{'|'.join(expected.causes)} -> {expected.action}"
    if observed is None:
        return Check(
            want,
            "-",
            False,
            False,
            False if expected.culprit == "fault" else None,
            False,
            False,
            None,
            None,
        )
    seen = (f"{observed.incident_class}/{observed.cause} {','.join(observed.nodes) or '-'} "
            f"r{','.join(map(str, observed.ranks)) or '-'} -> {observed.action or '-'}")
    target = next(
        (r for r in landed if _targeted(faults.get(r["fault"]))), landed[0] if landed else None
    )
    node_ok: bool | None
    rank_ok: bool | None = None
    if expected.culprit == "none":
        node_ok = not observed.nodes
    elif target is None:
        node_ok = False
    else:
        node_ok = set(observed.nodes) == {target.get("node")}
        if expected.culprit == "fault":
            rank_ok = set(observed.ranks) == {target.get("rank")}
    injected = landed[0]["ts"] if landed else None
    lat_i = (
        None
        if injected is None or observed.detected_ts is None
        else observed.detected_ts - injected
    )
    lat_d = (
        None if injected is None or observed.issued_ts is None else observed.issued_ts - injected
    )
    class_ok = expected.incident_class in ("any", observed.incident_class)
    return Check(
        want,
        seen,
        class_ok,
        node_ok,
        rank_ok,
        cause_family(observed.cause) in expected.families,
        observed.action == expected.action,
        lat_i,
        lat_d,
    )


def match_incidents(
    expected: Sequence[ExpectedIncident], observed: Sequence[Observed]
) -> list[int | None]:
    """For each expected incident, the index of the observed one it is judged against: in order, the
    next one of its class, else the next one. Observed incidents left over are extra (wrong)
    incidents."""
    picks: list[int | None] = []
    used: set[int] = set()
    last = -1
    for want in expected:
        free = [i for i in range(last + 1, len(observed)) if i not in used]
        pick = next((i for i in free if want.incident_class in ("any", observed[i].incident_class)),
                    free[0] if free else None)
        picks.append(pick)
        if pick is not None:
            used.add(pick)
            last = pick
    return picks


def score(scenario: Scenario, art: RunArtifacts) -> ScenarioScore:
    faults = {f.id: f for f in scenario.faults}
    observed, attempt_steps = read_observed(art.store, art.job_id)
    landed = _injections_by_attempt(art.lab_dir, faults)
    problems: list[str] = []
    checks = []
    matched = match_incidents(scenario.truth.incidents, observed)
    for i, expected in enumerate(scenario.truth.incidents):
        seen = None if matched[i] is None else observed[matched[i]]
        check = _check(
            expected,
            seen,
            landed.get(seen.attempt if seen and seen.attempt is not None else -1, []),
            faults,
        )
        checks.append(check)
        for flag, what in ((check.class_ok, "class"), (check.culprit_node_ok, "culprit node"),
                           (check.culprit_rank_ok, "culprit rank"), (check.cause_ok, "cause"),
                           (check.action_ok, "action")):
            if flag is False:
                problems.append(f"incident {i + 1}: {what} (want {check.expected}, got "
                                f"{check.observed})")
    count_ok = len(observed) == len(scenario.truth.incidents)
    if not count_ok:
        extra = [o for i, o in enumerate(observed) if i not in matched]
        problems.append(f"{len(observed)} incidents, {len(scenario.truth.incidents)} expected"
                        + (": extra " + "; ".join(f"{o.incident_class}/{o.cause} on "
                                                  f"{','.join(o.nodes) or '-'} "
                                                   f"({o.rule}, {o.confidence}) -> "
                                                   f"{o.action or '-'}" for o in extra)
                           if extra else ""))
    # exclusions: a failover the truth expects excludes exactly its culprit node
    allowed: set[str] = set()
    for i, expected in enumerate(scenario.truth.incidents):
        if expected.action == "failover" and expected.culprit != "none" and matched[i] is not None:
            attempt = observed[matched[i]].attempt or 0
            target = [r for r in landed.get(attempt, []) if _targeted(faults.get(r["fault"]))]
            allowed.update(r["node"] for r in target[:1] if r.get("node"))
    excluded: list[str] = []
    for obs in observed:
        if obs.action == "failover":
            excluded.extend(n for n in obs.exclude if n not in excluded)
    healthy_excluded = tuple(n for n in excluded if n not in allowed)
    if healthy_excluded:
        problems.append(f"healthy nodes excluded: {', '.join(healthy_excluded)}")
    failovers = sum(1 for o in observed if o.action == "failover")
    software = any("software" in e.families for e in scenario.truth.incidents)
    refailover = software and failovers >= 2
    if refailover:
        problems.append(f"software bug failed over {failovers} times")
    restore_ok, restores, resumed_ok = _restores(
        scenario, art, observed, attempt_steps, landed, problems
    )
    final = max(attempt_steps) if attempt_steps else None
    finished = (art.rc == 0 and final is not None and scenario.steps > 0
                and attempt_steps[final][1] == scenario.steps - 1)
    finished_ok = finished == scenario.truth.finished
    if not finished_ok:
        problems.append(f"training {'finished' if finished else 'did not finish'} (rc {art.rc}"
                        f"{', timed out' if art.timed_out else ''}"
                        f"{f' at {art.allowed_s:g} s' if art.timed_out and art.allowed_s else ''}"
                        "), expected "
                        f"{'finished' if scenario.truth.finished else 'stopped'}")
    problems.extend(f"campaign: {e}" for e in art.errors)
    return ScenarioScore(
        name=scenario.name, fault_type=scenario.fault_type, healthy=scenario.truth.healthy,
        cpu_hog=scenario.cpu_hog > 0, latency_class=latency_class(scenario), checks=tuple(checks),
        incidents=tuple(observed), incident_count_ok=count_ok, excluded=tuple(excluded),
        healthy_excluded=healthy_excluded, failovers=failovers, software_refailover=refailover,
        restore_ok=restore_ok, restores=tuple(restores), resumed_ok=resumed_ok, finished=finished,
        finished_ok=finished_ok, rc=art.rc, timed_out=art.timed_out, wall_s=round(art.wall_s, 1),
        problems=tuple(problems))


def _restores(
    scenario: Scenario,
    art: RunArtifacts,
    observed: list[Observed],
    attempt_steps: Mapping[int, tuple[int, int]],
    landed: Mapping[int, list[dict[str, Any]]],
    problems: list[str],
) -> tuple[bool | None, list[str], bool | None]:
    """Each failover's restore plan against the expected step, and whether the next attempt resumed
    there.
    """
    world = scenario.nodes * scenario.ranks
    bad_step = None
    if scenario.truth.restore == "before_fault":
        steps = [r["step"] for rows in landed.values() for r in rows if r.get("step") is not None]
        bad_step = min(steps) if steps else None
    excluded: set[str] = set()
    restores, restore_ok, resumed_ok = [], None, None
    for obs in observed:
        if obs.action != "failover" or obs.attempt is None:
            continue
        excluded.update(obs.exclude)
        name = f"restore-plan-{obs.attempt + 1}.json"
        path = art.workdir / name
        snapshot = art.snapshots.get(name)
        if not path.exists() or snapshot is None:
            restore_ok = False
            problems.append(f"failover of attempt {obs.attempt}: no restore plan {name}")
            continue
        plan = json.loads(path.read_text())
        want = expected_restore(snapshot["checkpoints"], world, excluded, bad_step)
        got = plan.get("step")
        bad_sources = [s for s in plan.get("sources") or () if s.get("node") in excluded
                       or any(f"/nodes/{n}/" in str(s.get("uri")) for n in excluded)]
        ok = got == want and not bad_sources
        restores.append(
            f"a{obs.attempt + 1}: step {got} (expected {want})"
            + (" FROM EXCLUDED NODE" if bad_sources else "")
        )
        if not ok:
            problems.append(
                f"restore for attempt {obs.attempt + 1}: step {got}, expected {want}"
                + (f"; reads {len(bad_sources)} shards from excluded nodes" if bad_sources else "")
            )
        restore_ok = ok if restore_ok is None else restore_ok and ok
        nxt = attempt_steps.get(obs.attempt + 1)
        start = 0 if got is None else got + 1
        resumed = nxt is not None and nxt[0] == start
        if not resumed:
            problems.append(f"attempt {obs.attempt + 1} did not resume at step {start} "
                            f"(its first step: {None if nxt is None else nxt[0]})")
        resumed_ok = resumed if resumed_ok is None else resumed_ok and resumed
    return restore_ok, restores, resumed_ok


# ---------------------------------------------------------------------- aggregates


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def summarize(scores: Sequence[ScenarioScore]) -> dict[str, Any]:
    faulty = [s for s in scores if not s.healthy]
    healthy = [s for s in scores if s.healthy]
    checks = [c for s in faulty for c in s.checks]
    class_right = [s for s in scores if s.incident_count_ok and all(c.class_ok for c in s.checks)]
    node_checks = [c.culprit_node_ok for c in checks if c.culprit_node_ok is not None]
    restores = [s.restore_ok for s in scores if s.restore_ok is not None]
    latency: dict[str, dict[str, float | None]] = {}
    for cls in ("crash", "node_loss", "hang", "slowdown", "data"):
        firsts = [s.checks[0] for s in faulty if s.latency_class == cls and s.checks]
        latency[cls] = {
            "fault_to_incident_s": _median([c.latency_incident_s for c in firsts]),
            "fault_to_decision_s": _median([c.latency_decision_s for c in firsts]),
            "n": len(firsts),
        }
    return {
        "scenarios": len(scores),
        "passed": sum(s.ok for s in scores),
        "class_accuracy": round(len(class_right) / len(scores), 3) if scores else None,
        "culprit_node_exact": round(sum(node_checks) / len(node_checks), 3)
        if node_checks
        else None,
        "cause_family_right": round(sum(c.cause_ok for c in checks) / len(checks), 3)
        if checks
        else None,
        "action_right": round(sum(c.action_ok for c in checks) / len(checks), 3)
        if checks
        else None,
        "healthy_nodes_excluded": sum(len(s.healthy_excluded) for s in scores),
        "software_failed_over_more_than_once": sum(s.software_refailover for s in scores),
        "healthy_runs": len(healthy),
        "healthy_runs_with_cpu_hog": sum(s.cpu_hog for s in healthy),
        "incidents_on_healthy_runs": sum(len(s.incidents) for s in healthy),
        "restores_right": f"{sum(restores)}/{len(restores)}",
        "finished_as_expected": f"{sum(s.finished_ok for s in scores)}/{len(scores)}",
        "median_latency": latency,
    }
