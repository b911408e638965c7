"""The one extension point of the engine: the Detector protocol, the pass it reads, and the registry.

A detector turns telemetry into incidents. The engine builds every registered detector once (each from the
shared `DetectorInputs`: rules, thresholds, XID catalog, hang analyzer, dump requester) and runs them in
registration order. A JOB detector runs over one job's telemetry (`JobPass`) and sees what the detectors before it
found and noted there: the crash detector notes the attempts that crashed or hung, so the hang detector does not
analyse a crashed attempt and the straggler detector drops a slowdown that follows a failure. A STORE detector
runs once per pass over every node's events (`StorePass`), after every job (GPU health concerns nodes without a
job too). A new incident class is one module here: a class with `name`, `scope` and `detect`, and one
`register()` call.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pandas as pd

from faultlens.attribution.incident import Incident
from faultlens.errors import FaultlensError

if TYPE_CHECKING:
    from faultlens.attribution.reading.telemetry import Telemetry
    from faultlens.attribution.rules import CrashRules, Thresholds

AttemptKey = tuple[str | None, int | None]


class Scope(enum.Enum):
    UNKNOWN = "unknown"
    JOB = "job"  # once per job (or per attempt window), over that job's telemetry
    STORE = "store"  # once per pass, over every node's events, after the jobs


@dataclass(frozen=True)
class DetectorInputs:
    """What detectors are built from (the engine's configuration)."""

    crash_rules: CrashRules
    thresholds: Thresholds
    catalog: Any  # an XID catalog (attribution.hardware.XidCatalogLike)
    analyzer: Any = None  # the hang analyzer (dumps -> report); None: the built-in analysis
    dump_requester: Any = None  # asks the supervisor or agents for flight-recorder dumps; None: none asked


@dataclass(frozen=True)
class JobOptions:
    """How a job pass runs (live mode passes these per poll)."""

    settled: Callable[[str | None, int | None], bool] | None = None
    # live mode: when a failure of the attempt was first seen (None: not seen yet, or a batch pass): the waits for
    # the other nodes' reports count from then, never from the failure's own stamp alone (torchrun's error files
    # carry whole seconds, and a loaded collector delivers a report seconds after it was written)
    failure_seen: Callable[[str | None, int | None], dt.datetime | None] | None = None
    already: frozenset[str] = frozenset()  # incident ids reported before: not reported (or analysed) again
    hangs: bool = True
    stragglers: bool = True
    straggler_last_steps: int | None = None


@dataclass
class JobPass:
    """One job's pass: its telemetry and options, the incidents found so far (in order, first wins) and what the
    detectors noted for the ones after them."""

    telemetry: Telemetry
    now: dt.datetime
    as_of: dt.datetime | None
    options: JobOptions = field(default_factory=JobOptions)
    hung: dict[AttemptKey, dt.datetime] = field(default_factory=dict)  # attempts reported hung, and since when
    failed: dict[AttemptKey, dt.datetime] = field(default_factory=dict)  # attempts reported crashed (live)
    busy: set[AttemptKey] = field(default_factory=set)  # attempts that crashed or are not settled: no hang pass
    notes: dict[str, Any] = field(default_factory=dict)  # what one detector leaves for the next (by name)
    incidents: dict[str, Incident] = field(default_factory=dict)

    def add(self, found: Iterable[Incident]) -> None:
        for incident in found:
            self.incidents.setdefault(incident.incident_id, incident)


@dataclass(frozen=True)
class StorePass:
    """The pass over every node's GPU events, after the jobs: `failures` are the crash and hang incidents that
    may explain an event; `settled_before`: only events older than this (live: a failure is reported first)."""

    gpu_events: pd.DataFrame
    now: dt.datetime
    failures: tuple[Incident, ...] = ()
    settled_before: dt.datetime | None = None


@runtime_checkable
class Detector(Protocol):
    """Telemetry -> incidents. `detect` receives a JobPass (scope JOB) or a StorePass (scope STORE) and returns
    the incidents it found; the engine adds them to the pass (an id already there keeps the first)."""

    name: str
    scope: Scope

    def detect(self, run: Any) -> list[Incident]: ...


DetectorFactory = Callable[[DetectorInputs], Detector]


class DetectorRegistryError(FaultlensError, ValueError):
    """A detector registered twice, or a name that is not registered."""


class DetectorRegistry:
    """Detector factories by name, in registration order (the order the engine runs them)."""

    def __init__(self) -> None:
        self._factories: dict[str, DetectorFactory] = {}

    def register(self, name: str, factory: DetectorFactory) -> None:
        if name in self._factories:
            raise DetectorRegistryError(f"detector {name!r} is already registered")
        self._factories[name] = factory

    def copy(self) -> DetectorRegistry:
        """A registry with the same detectors, to extend without changing this one."""
        other = DetectorRegistry()
        other._factories = dict(self._factories)
        return other

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def build(self, inputs: DetectorInputs, names: Iterable[str] | None = None) -> tuple[Detector, ...]:
        """The detectors (all, or `names` in registration order), each built once from `inputs`."""
        wanted = set(self._factories) if names is None else set(names)
        unknown = wanted - set(self._factories)
        if unknown:
            raise DetectorRegistryError(f"no detector named {', '.join(sorted(unknown))} (registered: "
                                        f"{', '.join(self._factories)})")
        return tuple(factory(inputs) for name, factory in self._factories.items() if name in wanted)


REGISTRY = DetectorRegistry()
register = REGISTRY.register
