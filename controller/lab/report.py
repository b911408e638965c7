"""Markdown tables of a campaign: per fault type, per scenario, and the aggregates the issue asks
for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from faultlens.controller.lab.score import ScenarioScore


def _frac(flags: Sequence[bool | None]) -> str:
    known = [f for f in flags if f is not None]
    return f"{sum(known)}/{len(known)}" if known else "-"


def _med(values: Sequence[float | None]) -> str:
    present = sorted(v for v in values if v is not None)
    if not present:
        return "-"
    mid = len(present) // 2
    value = present[mid] if len(present) % 2 else (present[mid - 1] + present[mid]) / 2
    return f"{value:.1f}"


def by_fault_type(scores: Sequence[ScenarioScore]) -> str:
    types: dict[str, list[ScenarioScore]] = {}
    for s in scores:
        types.setdefault(s.fault_type, []).append(s)
    lines = ["| fault type | runs | class | culprit node | culprit rank | cause family | action | "
             "restore | "
             "finished as expected | fault->incident s | fault->decision s | all right |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, group in types.items():
        checks = [c for s in group for c in s.checks]
        firsts = [s.checks[0] for s in group if s.checks]
        healthy = all(s.healthy for s in group)
        class_flags = [s.incident_count_ok and all(c.class_ok for c in s.checks) for s in group]
        lines.append(
            " | ".join(
                [
                    f"| {name}",
                    str(len(group)),
                    _frac(class_flags),
                    "-" if healthy else _frac([c.culprit_node_ok for c in checks]),
                    "-" if healthy else _frac([c.culprit_rank_ok for c in checks]),
                    "-" if healthy else _frac([c.cause_ok for c in checks]),
                    "-" if healthy else _frac([c.action_ok for c in checks]),
                    _frac([s.restore_ok for s in group]),
                    _frac([s.finished_ok for s in group]),
                    _med([c.latency_incident_s for c in firsts]),
                    _med([c.latency_decision_s for c in firsts]),
                    f"{sum(s.ok for s in group)}/{len(group)} |",
                ]
            )
        )
    return "\n".join(lines)


def by_scenario(scores: Sequence[ScenarioScore]) -> str:
    lines = ["| scenario | expected | observed | excluded | restore | finished | s | problems |",
             "|---|---|---|---|---|---|---|---|"]
    for s in scores:
        expected = "; ".join(c.expected for c in s.checks) or "no incident"
        observed = "; ".join(f"{o.incident_class}/{o.cause} {','.join(o.nodes) or '-'} "
                             f"r{','.join(map(str, o.ranks)) or '-'} ({o.confidence}) -> "
                             f"{o.action or '-'}"
                             for o in s.incidents) or "-"
        problems = "; ".join(s.problems) or "ok"
        lines.append(f"| {s.name} | {expected} | {_cell(observed)} | {','.join(s.excluded) or '-'} "
                     "| "
                     f"{'; '.join(s.restores) or '-'} | {'yes' if s.finished else 'no'} | "
                     f"{s.wall_s:.0f} | "
                     f"{_cell(problems)} |")
    return "\n".join(lines)


def aggregates(summary: dict[str, Any]) -> str:
    lat = summary.get("median_latency") or {}
    rows = [
        ("scenarios (all checks right)", f"{summary['scenarios']} ({summary['passed']})"),
        ("class right", summary["class_accuracy"]),
        ("culprit node exact", summary["culprit_node_exact"]),
        ("cause family right", summary["cause_family_right"]),
        ("action right", summary["action_right"]),
        ("healthy nodes excluded", summary["healthy_nodes_excluded"]),
        (
            "software bugs failed over more than once",
            summary["software_failed_over_more_than_once"],
        ),
        (
            "incidents on healthy runs",
            f"{summary['incidents_on_healthy_runs']} on "
            f"{summary['healthy_runs']} runs "
            f"({summary['healthy_runs_with_cpu_hog']} with a CPU hog)",
        ),
        ("restores right", summary["restores_right"]),
        ("finished / stopped as expected", summary["finished_as_expected"]),
    ]
    for cls in ("crash", "node_loss", "hang", "slowdown", "data"):
        item = lat.get(cls) or {}
        if item.get("n"):
            rows.append((f"median fault -> incident / decision, {cls} (n={item['n']})",
                         f"{item['fault_to_incident_s']} s / {item['fault_to_decision_s']} s"))
    if summary.get("not_run"):
        rows.append(("not run (campaign deadline)", ", ".join(summary["not_run"])))
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(scores: Sequence[ScenarioScore], summary: dict[str, Any]) -> str:
    return "\n\n".join([aggregates(summary), by_fault_type(scores), by_scenario(scores)])
