"""The recorded GPU backend: replays a timeline file through the GpuBackend interface, for machines
without a GPU.

The timeline (docs/recorded-timeline.md) lists the GPUs of a node with their starting values
(gpu_samples metric columns) and timed steps: `set` changes values, `event` delivers an event
through wait_events() (an Xid, a recovery-action change), `lost` makes the GPU fall off the bus
(sample() then raises GpuLostError), and `reset_required` marks readings as
NVML_ERROR_RESET_REQUIRED would. Times are seconds after open(), scaled by `time_scale`. The clock
is a constructor argument, so tests can step time by hand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import Field, create_model, model_validator

from faultlens.collectors.rule_loader import RuleFileError, field_error, read_document, validate
from faultlens.collectors.rule_model import (
    FileModel,
    FormatVersion1,
    NonNegative,
    NonNegativeInt,
    Text,
)
from faultlens.collectors.sources.gpu_backend import (
    EVENT_KINDS,
    SAMPLE_COLUMNS,
    BackendEvent,
    BackendUnavailable,
    GpuDevice,
    GpuLostError,
    GpuReading,
)
from faultlens.collectors.sources.pci import normalize_pci_bus_id
from faultlens.collectors.store.schema import TABLES

FORMAT_VERSION = 1


class RecordedTimelineError(RuleFileError):
    """A timeline file cannot be used: the message names the file, the key and what was expected."""


def _column_type(column: str) -> Any:
    typ = TABLES["gpu_samples"].field(column).type
    if pa.types.is_boolean(typ):
        return bool | None
    if pa.types.is_integer(typ):
        return int | None
    return float | None


# the metric columns of gpu_samples, each optional (null: not read)
_Values = create_model(
    "_Values",
    __base__=FileModel,
    **{column: (_column_type(column), None) for column in SAMPLE_COLUMNS},
)  # type: ignore[call-overload]


class _Gpu(FileModel):
    index: NonNegativeInt
    uuid: Annotated[str, Field(pattern="^GPU-[0-9a-fA-F-]+$")] | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    values: _Values | None = None  # type: ignore[valid-type]


class _Event(FileModel):
    kind: Literal[tuple(sorted(EVENT_KINDS))]  # type: ignore[valid-type]
    code: int | None = None
    message: str = ""


class _TimelineStep(FileModel):
    at: NonNegative
    gpu: NonNegativeInt
    set: _Values | None = None  # type: ignore[valid-type]
    event: _Event | None = None
    lost: Text | None = None
    reset_required: bool | None = None

    @model_validator(mode="after")
    def _does_something(self) -> _TimelineStep:
        if not self.model_fields_set - {"at", "gpu"}:
            raise ValueError("at least one of set, event, lost, reset_required")
        return self


class TimelineFile(FileModel):
    """A recorded GPU timeline (docs/recorded-timeline.md)."""

    format_version: FormatVersion1
    description: str | None = None
    defaults: _Values | None = None  # type: ignore[valid-type]
    gpus: Annotated[list[_Gpu], Field(min_length=1)]
    timeline: list[_TimelineStep] | None = None


@dataclass(frozen=True)
class _Step:
    at: float
    gpu: int
    values: Mapping[str, Any] | None
    event: Mapping[str, Any] | None
    lost: str | None
    reset_required: bool | None


def load_timeline(path: str | Path) -> dict[str, Any]:
    """Read and validate a timeline file (YAML; JSON is YAML too). Raises RecordedTimelineError."""
    file = Path(path)
    document = read_document(file, error=RecordedTimelineError)
    validate_timeline(document, str(file))
    return document


def validate_timeline(document: Any, source: str = "<timeline>") -> None:
    validate(document, TimelineFile, source, error=RecordedTimelineError)
    indexes = [gpu["index"] for gpu in document["gpus"]]
    for position, index in enumerate(indexes):
        if indexes.index(index) != position:
            raise field_error(source, ["gpus", position, "index"], "expected a unique index, "
                                                                   f"{index} repeats",
                              RecordedTimelineError)
    for position, gpu in enumerate(document["gpus"]):
        if "pci_bus_id" in gpu and normalize_pci_bus_id(gpu["pci_bus_id"]) is None:
            raise RecordedTimelineError(f"{source}: gpus[{position}].pci_bus_id: expected a PCI "
                                        "address like "
                                        f"00000000:18:00.0, got {gpu['pci_bus_id']!r}")
    for position, step in enumerate(document.get("timeline") or []):
        if step["gpu"] not in indexes:
            raise RecordedTimelineError(f"{source}: timeline[{position}].gpu: expected one of the "
                                        "GPU indexes "
                                        f"{sorted(indexes)}, got {step['gpu']}")


class RecordedBackend:
    """GpuBackend that replays a validated timeline document (see load_timeline)."""

    name = "recorded"
    sample_source = "recorded"
    event_source = "recorded"
    delta_source = "recorded"

    def __init__(
        self,
        timeline: Mapping[str, Any] | str | Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        time_scale: float = 1.0,
    ) -> None:
        if isinstance(timeline, (str, Path)):
            self.source = str(timeline)
            document = load_timeline(timeline)
        else:
            self.source = "<timeline>"
            validate_timeline(timeline)
            document = dict(timeline)
        self._document = document
        self._clock = clock
        self._scale = time_scale
        self._t0: float | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        defaults = dict(document.get("defaults") or {})
        self._devices: list[GpuDevice] = []
        self._base: dict[int, dict[str, Any]] = {}
        for gpu in document["gpus"]:
            self._devices.append(GpuDevice(index=gpu["index"], uuid=gpu.get("uuid"),
                                           pci_bus_id=normalize_pci_bus_id(gpu.get("pci_bus_id")),
                                           name=gpu.get("name")))
            values = {column: None for column in SAMPLE_COLUMNS}
            values.update(defaults)
            values.update(gpu.get("values") or {})
            self._base[gpu["index"]] = values
        steps = [
            _Step(
                at=float(s["at"]) * time_scale,
                gpu=s["gpu"],
                values=s.get("set"),
                event=s.get("event"),
                lost=s.get("lost"),
                reset_required=s.get("reset_required"),
            )
            for s in document.get("timeline") or []
        ]
        self._steps = sorted(steps, key=lambda s: s.at)
        self._event_steps = [s for s in self._steps if s.event is not None]
        self._delivered = 0
        self._closed = False

    def _elapsed(self) -> float:
        if self._t0 is None:
            raise BackendUnavailable("recorded backend used before open()")
        return self._clock() - self._t0

    def open(self) -> Sequence[GpuDevice]:
        self._t0 = self._clock()
        self._closed = False
        self._wake.clear()
        return list(self._devices)

    def sample(self, device: GpuDevice) -> GpuReading:
        now = self._elapsed()
        values = dict(self._base.get(device.index, {}))
        reset_required = False
        for step in self._steps:
            if step.at > now:
                break
            if step.gpu != device.index:
                continue
            if step.lost:
                raise GpuLostError(device, step.lost)
            if step.values:
                values.update(step.values)
            if step.reset_required is not None:
                reset_required = step.reset_required
        return GpuReading(values=values, reset_required=reset_required)

    def supports_events(self) -> bool:
        return bool(self._event_steps)

    def _due(self, now: float) -> list[BackendEvent]:
        events = []
        with self._lock:
            while (
                self._delivered < len(self._event_steps)
                and self._event_steps[self._delivered].at <= now
            ):
                step = self._event_steps[self._delivered]
                self._delivered += 1
                event = step.event or {}
                events.append(
                    BackendEvent(
                        gpu_index=step.gpu,
                        kind=event["kind"],
                        code=event.get("code"),
                        message=event.get("message") or f"recorded {event['kind']} event",
                    )
                )
        return events

    def wait_events(self, timeout_s: float) -> list[BackendEvent]:
        if self._closed or self._t0 is None:
            return []
        events = self._due(self._elapsed())
        if events or timeout_s <= 0:
            return events
        with self._lock:
            upcoming = (
                self._event_steps[self._delivered].at
                if self._delivered < len(self._event_steps)
                else None
            )
        wait = (
            timeout_s if upcoming is None else max(0.0, min(timeout_s, upcoming - self._elapsed()))
        )
        self._wake.wait(wait)
        if self._closed:
            return []
        return self._due(self._elapsed())

    def close(self) -> None:
        self._closed = True
        self._wake.set()
