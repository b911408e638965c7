"""The one extension point of the engine: the Detector protocol, the passes it reads, the registry.

A detector turns telemetry into incidents. The engine builds every registered detector once (each
from the shared `DetectorInputs`: rules, thresholds, XID catalog, hang analyzer, dump requester) and
runs them in registration order. A JOB detector runs over one job's telemetry (`JobPass`: the live
follower, a pass over telemetry in memory) and sees what the detectors before it found and noted
there: the crash detector notes the attempts that crashed or hung, so the hang detector does not
analyse a crashed attempt and the straggler detector drops a slowdown that follows a failure. A
STORE detector runs once per pass over every node's events (`StorePass`), after every job (GPU
health concerns nodes without a job too).

The batch pass over a store (Engine.run_windows) runs every JOB detector attempt by attempt, in
bounded memory: per job an optional `prepare_job(WindowedPass)`, once, before the attempts (what
looks into every attempt, read from the job's context), then per attempt
`detect_attempt(AttemptPass)`, which reads the windows of that attempt it needs
(attribution/reading/windows.py), each on first use, and the notes the detectors before it left on
that attempt. A detector without `detect_attempt` declares the one window its `detect` reads
(`window`, an AttemptWindow): `detect` then runs once per attempt over a JobPass of that window, and
the incidents of that attempt are kept. A JOB detector with neither is refused when the engine is
built (DetectorRegistryError): the batch pass never reads a job whole because of which detectors are
registered.

A new incident class is one module here: a class with `name`, `scope`, `detect` (and
`detect_attempt`, or a `window`), and one `register()` call (docs/architecture.md "Adding an
incident class").
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pandas as pd

from faultlens.attribution.incident import Incident
from faultlens.errors import FaultlensError

if TYPE_CHECKING:
    from faultlens.attribution.reading.telemetry import Telemetry
    from faultlens.attribution.reading.windows import JobWindows
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
    # asks the supervisor or agents for flight-recorder dumps; None: none asked
    dump_requester: Any = None


@dataclass(frozen=True)
class JobOptions:
    """How a job pass runs (live mode passes these per poll)."""

    settled: Callable[[str | None, int | None], bool] | None = None
    # live mode: when a failure of the attempt was first seen (None: not seen yet, or a batch pass):
    # the waits for the other nodes' reports count from then, never from the failure's own stamp
    # alone (torchrun's error files carry whole seconds, and a loaded collector delivers a report
    # seconds after it was written)
    failure_seen: Callable[[str | None, int | None], dt.datetime | None] | None = None
    # incident ids reported before: not reported (or analysed) again
    already: frozenset[str] = frozenset()
    # attempts whose crash or hang was reported before (live): a later stall or timeout of the
    # same attempt is that failure's consequence, not a second hang
    reported: frozenset[AttemptKey] = frozenset()
    hangs: bool = True
    stragglers: bool = True
    straggler_last_steps: int | None = None


@dataclass
class JobPass:
    """One job's pass: its telemetry and options, the incidents found so far (in order, first wins)
    and what the detectors noted for the ones after them."""

    telemetry: Telemetry
    now: dt.datetime
    as_of: dt.datetime | None
    options: JobOptions = field(default_factory=JobOptions)
    # attempts reported hung, and since when
    hung: dict[AttemptKey, dt.datetime] = field(default_factory=dict)
    # attempts reported crashed (live)
    failed: dict[AttemptKey, dt.datetime] = field(default_factory=dict)
    # attempts that crashed or are not settled: no hang pass
    busy: set[AttemptKey] = field(default_factory=set)
    # what one detector leaves for the next (by name)
    notes: dict[str, Any] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)

    def add(self, found: Iterable[Incident]) -> None:
        for incident in found:
            self.incidents.setdefault(incident.incident_id, incident)


@dataclass(frozen=True)
class StorePass:
    """The pass over every node's GPU events, after the jobs: `failures` are the crash and hang
    incidents that may explain an event; `settled_before`: only events older than this (live: a
    failure is reported first)."""

    gpu_events: pd.DataFrame
    now: dt.datetime
    failures: tuple[Incident, ...] = ()
    settled_before: dt.datetime | None = None


class AttemptWindow(enum.Enum):
    """The windows of one attempt a detector without `detect_attempt` may declare as its `window`:
    its `detect` then reads that window's telemetry (AttemptPass.window) once per attempt."""

    UNKNOWN = "unknown"  # no window the pass can read: refused like no declaration
    CONTEXT = "context"  # small tables, steps digest, this attempt's flight-recorder entries
    PROGRESS = "progress"  # the context, with this attempt's step rows progress detection reads
    LOSS = "loss"  # the context, with this attempt's step rows that carry a loss


@dataclass
class WindowedPass:
    """One job's windowed batch pass (Engine.run_windows): its windows, the attempts it visits (the
    job's, and those a prepare step names), what the `prepare_job` steps noted (by name), the
    incidents found so far (in order, first wins), and why the job's data must be read whole
    (`whole_job`, set by a prepare step that finds evidence no attempt window holds: the engine then
    runs the job as one JobPass over all its rows)."""

    windows: JobWindows
    now: dt.datetime
    as_of: dt.datetime | None
    attempts: set[int] = field(default_factory=set)
    notes: dict[str, Any] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)
    whole_job: str | None = None

    def __post_init__(self) -> None:
        self.attempts |= set(self.windows.attempts)

    @property
    def job(self) -> str:
        return self.windows.job

    @property
    def context(self) -> Telemetry:
        """The job's small tables whole, the steps digest of every attempt (JobWindows.context)."""
        return self.windows.context

    def visit(self, attempts: Iterable[int]) -> None:
        """Visit these attempts too (an attempt the evidence names that has no rows of its own)."""
        self.attempts |= set(attempts)

    def read_whole(self, reason: str) -> None:
        """This job's data cannot be judged attempt by attempt: the engine reads it whole."""
        if self.whole_job is None:
            self.whole_job = reason


@dataclass
class AttemptPass:
    """One attempt of a windowed pass, as its JOB detectors read it: the windows of this attempt
    (each read on first use and held until the attempt is done; `straggler_chunks`, every row of
    it, read anew on each call), what the detectors before this one noted on it (as in a JobPass:
    `notes` by name, `busy`, `hung`), and the job's incidents so far (the WindowedPass's)."""

    job_pass: WindowedPass
    attempt: int
    hung: dict[AttemptKey, dt.datetime] = field(default_factory=dict)  # stalled, from when
    busy: set[AttemptKey] = field(default_factory=set)  # crashed or not settled: no hang pass
    notes: dict[str, Any] = field(default_factory=dict)  # what one detector leaves for the next
    _held: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> AttemptKey:
        return (self.job_pass.job, self.attempt)

    @property
    def job(self) -> str:
        return self.job_pass.job

    @property
    def now(self) -> dt.datetime:
        return self.job_pass.now

    @property
    def as_of(self) -> dt.datetime | None:
        return self.job_pass.as_of

    @property
    def incidents(self) -> dict[str, Incident]:
        return self.job_pass.incidents

    @property
    def context(self) -> Telemetry:
        """The job's small tables whole, the steps digest of every attempt, no collectives."""
        return self.job_pass.context

    @property
    def step_columns(self) -> list[str]:
        """The columns of each `straggler_chunks` frame."""
        return self.job_pass.windows.step_columns

    def attempt_context(self) -> Telemetry:
        """The context with this attempt's flight-recorder entries (JobWindows.attempt_context)."""
        return self._read("context", self.job_pass.windows.attempt_context)

    def progress_window(self) -> Telemetry:
        """The step rows of this attempt progress detection reads (JobWindows.progress_window)."""
        return self._read("progress", self.job_pass.windows.progress_window)

    def loss_window(self) -> Telemetry:
        """The step rows of this attempt that carry a loss (JobWindows.loss_window)."""
        return self._read("loss", self.job_pass.windows.loss_window)

    def attempt_digest(self) -> pd.DataFrame:
        """This attempt's digest rows: where each rank ran, its highest step (attempt_digest)."""
        return self._read("digest", self.job_pass.windows.attempt_digest)

    def straggler_chunks(self) -> Iterator[pd.DataFrame]:
        """Every step row of this attempt (the straggler columns), in chunks of consecutive steps;
        memory holds one chunk, so each call reads them anew (JobWindows.straggler_chunks)."""
        return self.job_pass.windows.straggler_chunks(self.attempt)

    def window(self, which: AttemptWindow) -> Telemetry:
        """The telemetry of one declared window of this attempt."""
        readers = {AttemptWindow.CONTEXT: self.attempt_context,
                   AttemptWindow.PROGRESS: self.progress_window,
                   AttemptWindow.LOSS: self.loss_window}
        if which not in readers:
            raise DetectorRegistryError(f"no attempt window {which!r} (windows: "
                                        f"{', '.join(w.value for w in readers)})")
        return readers[which]()

    def add(self, found: Iterable[Incident]) -> None:
        for incident in found:
            self.incidents.setdefault(incident.incident_id, incident)

    def _read(self, name: str, reader: Callable[[int], Any]) -> Any:
        if name not in self._held:
            self._held[name] = reader(self.attempt)
        return self._held[name]


@runtime_checkable
class Detector(Protocol):
    """Telemetry -> incidents. `detect` receives a JobPass (scope JOB) or a StorePass (scope STORE)
    and returns the incidents it found; the engine adds them to the pass (an id already there keeps
    the first). A JOB detector also runs in the windowed batch pass: by its `detect_attempt`
    (AttemptDetector), or by its `detect` over the window it declares (`window`): attempt_step."""

    name: str
    scope: Scope

    def detect(self, run: Any) -> list[Incident]: ...


@runtime_checkable
class AttemptDetector(Detector, Protocol):
    """A JOB detector that runs on one attempt of the windowed batch pass: `detect_attempt` returns
    the incidents of that attempt, read from the AttemptPass's windows. It may also have
    `prepare_job(WindowedPass)`, run once per job before the attempts (prepare_step)."""

    def detect_attempt(self, run: AttemptPass) -> list[Incident]: ...


DetectorFactory = Callable[[DetectorInputs], Detector]


class DetectorRegistryError(FaultlensError, ValueError):
    """A detector registered twice, a name that is not registered, or a JOB detector the windowed
    batch pass cannot run (no `detect_attempt` and no declared `window`)."""


def attempt_step(detector: Detector) -> Callable[[AttemptPass], list[Incident]]:
    """How the windowed batch pass runs a JOB detector on one attempt: its `detect_attempt`; else
    its `detect` over a JobPass of the window it declares (`window`), keeping the incidents of that
    attempt (a window holds other attempts' context rows too: what it finds for them is not theirs
    to judge here). A detector with neither is refused (DetectorRegistryError), never run over the
    whole job."""
    own = getattr(detector, "detect_attempt", None)
    if callable(own):
        return own
    window = getattr(detector, "window", None)
    if not isinstance(window, AttemptWindow) or window is AttemptWindow.UNKNOWN:
        raise DetectorRegistryError(
            f"detector {detector.name!r} (scope job) cannot run attempt by attempt in the batch "
            "pass: give it detect_attempt(AttemptPass), or declare the window its detect reads "
            "(window = AttemptWindow.LOSS, say; attribution/detectors/base.py)")

    def over_window(run: AttemptPass) -> list[Incident]:
        job = JobPass(run.window(window), run.now, run.as_of, hung=run.hung, busy=run.busy,
                      notes=run.notes, incidents=dict(run.incidents))
        return [i for i in detector.detect(job) if (i.job_id, i.attempt) == run.key]

    return over_window


def prepare_step(detector: Detector) -> Callable[[WindowedPass], None] | None:
    """A detector's job-level step of the windowed batch pass (`prepare_job`), or None."""
    step = getattr(detector, "prepare_job", None)
    return step if callable(step) else None


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

    def build(
        self, inputs: DetectorInputs, names: Iterable[str] | None = None
    ) -> tuple[Detector, ...]:
        """The detectors (all, or `names` in registration order), each built once from `inputs`."""
        wanted = set(self._factories) if names is None else set(names)
        unknown = wanted - set(self._factories)
        if unknown:
            raise DetectorRegistryError(f"no detector named {', '.join(sorted(unknown))} "
                                        "(registered: "
                                        f"{', '.join(self._factories)})")
        return tuple(factory(inputs) for name, factory in self._factories.items() if name in wanted)


REGISTRY = DetectorRegistry()
register = REGISTRY.register
