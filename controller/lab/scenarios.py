"""Campaign scenarios from YAML (rules/campaign.yaml): the job (script, nodes x ranks, spares), the
faults, and the expected truth. A bad file fails with the file, the scenario and the key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultlens.collectors.rule_loader import RuleFileError, read_document
from faultlens.controller.lab.plan import FAULT_KINDS, FaultSpec
from faultlens.resources import rooms_root, rule_file, shipped_path, shipped_rule_file

# where the job scripts' paths (controller/lab/jobs/...) start: checkout or package
REPO_ROOT = rooms_root()
# the packaged file; load_campaign reads rule_file
DEFAULT_SCENARIOS = shipped_rule_file("campaign.yaml")

CLASSES = frozenset({"crash", "collective_hang", "straggler", "health", "numerics", "any"})
ACTIONS = frozenset({"failover", "restart", "escalate", "notify", "drain"})
CULPRITS = frozenset({"fault", "fault_node", "none"})
# cause families: the scoring compares these (the exact cause is reported beside)
CAUSE_FAMILIES: Mapping[str, str] = {
    "gpu_hardware": "hardware",
    "hbm": "hardware",
    "nvlink": "hardware",
    "pcie": "hardware",
    "network": "hardware",
    "thermal": "hardware",
    "host": "hardware",
    "software": "software",
    "oom": "software",
    "data_corruption": "data",
    "workload_imbalance": "imbalance",
    "unknown": "unknown",
}


class ScenarioError(RuleFileError):
    """The scenarios file is unreadable or wrong: the message names the file, the scenario and the
    key.
    """


def cause_family(cause: str | None) -> str:
    return CAUSE_FAMILIES.get(cause or "unknown", "unknown")


@dataclass(frozen=True)
class ExpectedIncident:
    incident_class: str
    causes: tuple[str, ...]  # any of these (compared by family)
    action: str
    # fault: the injected node and rank; fault_node: the node only; none: no node
    culprit: str = "fault"

    @property
    def families(self) -> frozenset[str]:
        return frozenset(cause_family(c) for c in self.causes)


@dataclass(frozen=True)
class Truth:
    incidents: tuple[ExpectedIncident, ...] = ()
    finished: bool = True  # training reaches its last step
    # newest | before_fault (data corruption: from before the first bad step)
    restore: str = "newest"

    @property
    def healthy(self) -> bool:
        return not self.incidents


@dataclass(frozen=True)
class Scenario:
    name: str
    fault_type: str  # the row of the results table
    script: str
    args: tuple[str, ...]
    nodes: int
    ranks: int
    spares: int
    max_attempts: int
    timeout_s: float
    faults: tuple[FaultSpec, ...]
    truth: Truth
    ci: bool = False
    steps: int = 0
    thresholds: str | None = None
    note: str = ""
    # the job stands for a long run: what the supervisor is told is left
    assume_remaining_s: float | None = None
    # the job's own environment (a user's script configured by environment variables, not args)
    env: Mapping[str, str] = field(default_factory=dict)
    # how long a slowdown's failover waits for a checkpoint boundary (`faultlens run
    # --checkpoint-wait`; None: its default): short for a script that writes no checkpoint
    checkpoint_wait_s: float | None = None

    @property
    def cpu_hog(self) -> int:
        return sum(int(f.params.get("processes", 1)) for f in self.faults if f.kind == "cpu_hog")


@dataclass(frozen=True)
class Campaign:
    source: str
    scenarios: tuple[Scenario, ...]
    gpu_timelines: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)

    def select(self, names: Sequence[str] | None = None, *, ci: bool = False) -> list[Scenario]:
        chosen = [s for s in self.scenarios if (not ci or s.ci)]
        if names:
            known = {s.name for s in self.scenarios}
            missing = [n for n in names if n not in known]
            if missing:
                raise ScenarioError(f"{self.source}: no scenario named {', '.join(missing)}")
            chosen = [s for s in chosen if s.name in set(names)]
        return chosen


def _need(doc: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise ScenarioError(f"{where}: missing key {key!r}")
    return doc[key]


def _expected(doc: Any, where: str) -> ExpectedIncident:
    if not isinstance(doc, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    cls = str(_need(doc, "class", where))
    if cls not in CLASSES:
        raise ScenarioError(f"{where}.class: expected one of {sorted(CLASSES)}, got {cls!r}")
    raw = _need(doc, "cause", where)
    causes = tuple(str(c) for c in (raw if isinstance(raw, list) else [raw]))
    for cause in causes:
        if cause not in CAUSE_FAMILIES:
            raise ScenarioError(f"{where}.cause: unknown cause {cause!r}")
    action = str(_need(doc, "action", where))
    if action not in ACTIONS:
        raise ScenarioError(f"{where}.action: expected one of {sorted(ACTIONS)}, got {action!r}")
    culprit = str(doc.get("culprit", "fault"))
    if culprit not in CULPRITS:
        raise ScenarioError(f"{where}.culprit: expected one of {sorted(CULPRITS)}, got {culprit!r}")
    return ExpectedIncident(cls, causes, action, culprit)


def _fault(doc: Any, where: str, index: int) -> FaultSpec:
    if not isinstance(doc, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    kind = str(_need(doc, "kind", where))
    if kind not in FAULT_KINDS:
        raise ScenarioError(f"{where}.kind: expected one of {sorted(FAULT_KINDS)}, got {kind!r}")
    attempts = doc.get("attempts", [0])
    if attempts == "all":
        attempts = None
    try:
        return FaultSpec.from_dict({**doc, "id": doc.get("id", f"f{index}"), "attempts": attempts})
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def load_campaign(path: str | Path | None = None) -> Campaign:
    """The campaign file: `path`, else campaign.yaml of the rules directory ($FAULTLENS_RULES, else
    packaged).
    """
    path = path if path is not None else rule_file("campaign.yaml")
    source = str(path)
    doc = read_document(path, error=ScenarioError)
    if not isinstance(doc, Mapping) or doc.get("format_version") != 1:
        got = doc.get("format_version") if isinstance(doc, Mapping) else type(doc).__name__
        raise ScenarioError(f"{source}: format_version: expected 1, got {got!r}")
    defaults = dict(doc.get("defaults") or {})
    scripts = dict(doc.get("scripts") or {})
    timelines = dict(doc.get("gpu_timelines") or {})
    scenarios: list[Scenario] = []
    seen: set[str] = set()
    for i, item in enumerate(doc.get("scenarios") or []):
        where = f"{source}: scenarios[{i}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(f"{where}: expected a mapping")
        name = str(_need(item, "name", where))
        where = f"{source}: scenario {name}"
        if name in seen:
            raise ScenarioError(f"{where}: duplicate name")
        seen.add(name)
        merged = {**defaults, **item}
        script_name = str(_need(merged, "script", where))
        if script_name not in scripts:
            raise ScenarioError(f"{where}.script: expected one of {sorted(scripts)}, got "
                                f"{script_name!r}")
        script = scripts[script_name]
        args = [*map(str, script.get("args") or []), *map(str, item.get("args") or [])]
        env = {**_env(script.get("env"), f"{where}.scripts.{script_name}.env"),
               **_env(item.get("env"), f"{where}.env")}
        faults = tuple(
            _fault(f, f"{where}.faults[{j}]", j) for j, f in enumerate(item.get("faults") or [])
        )
        for fault in faults:
            timeline = fault.params.get("timeline")
            if fault.kind == "gpu" and (timeline not in timelines or not fault.node):
                raise ScenarioError(f"{where}: gpu fault {fault.id}: needs node and a timeline of "
                                    "gpu_timelines "
                                    f"({sorted(timelines)}), got {timeline!r}")
        expect = item.get("expect") or {}
        if not isinstance(expect, Mapping):
            raise ScenarioError(f"{where}.expect: expected a mapping")
        incidents = tuple(_expected(e, f"{where}.expect.incidents[{j}]")
                          for j, e in enumerate(expect.get("incidents") or []))
        restore = str(expect.get("restore", "newest"))
        if restore not in ("newest", "before_fault"):
            raise ScenarioError(f"{where}.expect.restore: expected newest or before_fault, got "
                                f"{restore!r}")
        # the job's length: its --steps, else the script's `steps:` (a script that reads its own
        # length elsewhere, e.g. from its environment)
        steps = _steps(args) or int(item.get("steps", script.get("steps", 0)) or 0)
        wait = merged.get("checkpoint_wait_s", script.get("checkpoint_wait_s"))
        try:
            scenarios.append(
                Scenario(
                    name=name,
                    fault_type=str(item.get("type", name)),
                    script=str(shipped_path(script["path"])),
                    args=tuple(args),
                    nodes=int(merged.get("nodes", 2)),
                    ranks=int(merged.get("ranks", 2)),
                    spares=int(merged.get("spares", 2)),
                    max_attempts=int(merged.get("max_attempts", 4)),
                    timeout_s=float(merged.get("timeout_s", 300)),
                    faults=faults,
                    truth=Truth(incidents, bool(expect.get("finished", True)), restore),
                    ci=bool(item.get("ci", False)),
                    steps=steps,
                    thresholds=merged.get("thresholds"),
                    note=str(item.get("note", "")),
                    assume_remaining_s=(
                        None
                        if merged.get("assume_remaining_s") is None
                        else float(merged["assume_remaining_s"])
                    ),
                    env=env,
                    checkpoint_wait_s=(
                        None if wait is None else float(wait)
                    ),
                )
            )
        except (TypeError, ValueError) as exc:
            raise ScenarioError(f"{where}: {exc}") from None
    if not scenarios:
        raise ScenarioError(f"{source}: scenarios: expected at least one")
    return Campaign(source, tuple(scenarios), timelines)


def _env(doc: Any, where: str) -> dict[str, str]:
    """A job's environment variables: a mapping of names to scalars (given as strings)."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in doc.items()
    ):
        raise ScenarioError(f"{where}: expected a mapping of variable names to values")
    return {k: str(v) for k, v in doc.items()}


def _steps(args: Sequence[str]) -> int:
    """The job's --steps (the last given wins), 0 when not given."""
    steps = 0
    for i, arg in enumerate(args):
        if arg == "--steps" and i + 1 < len(args):
            steps = int(args[i + 1])
        elif arg.startswith("--steps="):
            steps = int(arg.split("=", 1)[1])
    return steps
