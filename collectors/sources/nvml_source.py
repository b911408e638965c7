"""The NVML source: samples every GPU through a GpuBackend, turns sample changes into gpu_events,
and runs a thread that waits on the backend's events (Xid, recovery action).

Never raises into its caller (collectors' error regime): a backend that cannot open is said once
("NVML unavailable: <reason>") and retried quietly every `retry_open_s`; a GPU that is lost gives
one gpu_lost event and is no longer sampled while the other GPUs go on; any other per-GPU failure is
logged once per kind and counted.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from faultlens.collectors.sources.gpu_backend import (
    BackendEvent,
    BackendUnavailable,
    GpuBackend,
    GpuDevice,
    GpuLostError,
)
from faultlens.collectors.sources.gpu_deltas import (
    DeltaThresholds,
    recovery_action_text,
    sample_changes,
)
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.batches import rows_to_batch

log = logging.getLogger("faultlens.collectors.nvml")

RECOVERY_GPU_RESET = 1


@dataclass
class NvmlStats:
    samples: int = 0
    events: int = 0
    sample_errors: int = 0
    event_errors: int = 0
    lost_gpus: int = 0
    unavailable: str | None = None
    field_errors: int = 0


@dataclass
class _GpuState:
    device: GpuDevice
    previous: dict[str, Any] | None = None
    previous_t: float | None = None
    lost: bool = False
    reset_required: bool = False
    reported_recovery: int | None = None
    logged: set[str] = field(default_factory=set)


class NvmlSource:
    """Source of gpu_samples and gpu_events from a GpuBackend (NvmlBackend on a GPU node,
    RecordedBackend in tests and demos)."""

    name = "nvml"

    def __init__(
        self,
        backend: GpuBackend,
        identity: NodeIdentity,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        events: bool = True,
        event_wait_s: float = 0.5,
        retry_open_s: float = 60.0,
        thresholds: DeltaThresholds | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.backend = backend
        self.identity = identity
        self._clock_ns = clock_ns
        self._monotonic = monotonic
        self._events_enabled = events
        self._event_wait_s = event_wait_s
        self._retry_open_s = retry_open_s
        self._thresholds = thresholds or DeltaThresholds()
        self._log = logger or log
        self.stats = NvmlStats()
        self._gpus: dict[int, _GpuState] = {}
        self._opened = False
        self._closed = False
        self._last_open_try: float | None = None
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle
    # ----------------------------------------------------------------------------------------------
    def open(self) -> bool:
        """Open the backend if not open yet; False when it is unavailable (said once)."""
        if self._opened:
            return True
        if self._closed:
            return False
        now = self._monotonic()
        if self._last_open_try is not None and now - self._last_open_try < self._retry_open_s:
            return False
        self._last_open_try = now
        try:
            devices = list(self.backend.open())
        except BackendUnavailable as exc:
            if self.stats.unavailable is None:
                self._log.warning("NVML unavailable: %s", exc)
            self.stats.unavailable = str(exc)
            return False
        except Exception as exc:  # a backend bug must not reach the training process
            if self.stats.unavailable is None:
                self._log.warning("NVML unavailable: %s: %s", type(exc).__name__, exc)
            self.stats.unavailable = f"{type(exc).__name__}: {exc}"
            return False
        self._gpus = {device.index: _GpuState(device) for device in devices}
        self._opened = True
        self.stats.unavailable = None
        if self._events_enabled and self._safe_supports_events():
            self._thread = threading.Thread(
                target=self._event_loop, name="faultlens-nvml-events", daemon=True
            )
            self._thread.start()
        return True

    def _safe_supports_events(self) -> bool:
        try:
            return bool(self.backend.supports_events())
        except Exception:
            return False

    def devices(self) -> list[GpuDevice]:
        """The GPUs of this node (opens the backend when needed; [] when unavailable)."""
        self.open()
        return [state.device for state in self._gpus.values()]

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        try:
            self.backend.close()  # wakes a waiting event thread
        except Exception as exc:
            self._log.debug("closing the %s backend: %s", self.backend.name, exc)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    # -- rows
    # ----------------------------------------------------------------------------------------------
    def _identity_columns(self, device: GpuDevice | None, ts_ns: int) -> dict[str, Any]:
        row: dict[str, Any] = {"ts": ts_ns, **self.identity.columns()}
        if device is not None:
            row.update(gpu_index=device.index, gpu_uuid=device.uuid, pci_bus_id=device.pci_bus_id)
        return row

    def _event_row(
        self,
        device: GpuDevice | None,
        ts_ns: int,
        source: str,
        kind: str,
        code: int | None,
        message: str,
    ) -> dict[str, Any]:
        return {
            **self._identity_columns(device, ts_ns),
            "source": source,
            "kind": kind,
            "code": code,
            "message": message,
        }

    # -- event thread
    # --------------------------------------------------------------------------------------------
    def _event_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                events = self.backend.wait_events(self._event_wait_s)
                failures = 0
            except Exception as exc:
                failures += 1
                self.stats.event_errors += 1
                if failures == 1:
                    self._log.warning(
                        "NVML event wait failed: %s: %s (retrying)", type(exc).__name__, exc
                    )
                self._stop.wait(min(5.0, 0.5 * failures))
                continue
            for event in events:
                row = self._backend_event_row(event)
                if row is not None:
                    self._queue.append(row)

    def _backend_event_row(self, event: BackendEvent) -> dict[str, Any] | None:
        """The gpu_events row of a backend event; None for a recovery action the samples already
        reported.
        """
        state = self._gpus.get(event.gpu_index) if event.gpu_index is not None else None
        device = state.device if state is not None else None
        if device is None and event.gpu_index is not None:
            device = GpuDevice(index=event.gpu_index)
        if event.kind == "recovery_action" and state is not None:
            if state.reported_recovery == event.code:
                return None
            state.reported_recovery = event.code
        return self._event_row(
            device,
            event.ts_ns or self._clock_ns(),
            self.backend.event_source,
            event.kind,
            event.code,
            event.message,
        )

    # -- poll
    # ----------------------------------------------------------------------------------------------
    def poll(self) -> Mapping[str, pa.RecordBatch]:
        try:
            return self._poll()
        except Exception as exc:  # never raise into the agent
            self.stats.sample_errors += 1
            self._log.warning("nvml source: poll failed: %s: %s", type(exc).__name__, exc)
            return {}

    def _poll(self) -> Mapping[str, pa.RecordBatch]:
        if not self.open():
            return {}
        samples: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        for state in self._gpus.values():
            if state.lost:
                continue
            self._sample_one(state, samples, events)
        while self._queue:
            events.append(self._queue.popleft())
        result: dict[str, pa.RecordBatch] = {}
        if samples:
            result["gpu_samples"] = rows_to_batch("gpu_samples", samples)
            self.stats.samples += len(samples)
        if events:
            result["gpu_events"] = rows_to_batch("gpu_events", events)
            self.stats.events += len(events)
        return result

    def _sample_one(
        self, state: _GpuState, samples: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> None:
        device = state.device
        ts_ns = self._clock_ns()
        now = self._monotonic()
        try:
            reading = self.backend.sample(device)
        except GpuLostError as exc:
            state.lost = True
            self.stats.lost_gpus += 1
            self._log.warning(
                "GPU %s (%s) is lost: %s", device.index, device.pci_bus_id, exc.reason
            )
            events.append(
                self._event_row(
                    device,
                    ts_ns,
                    self.backend.delta_source,
                    "gpu_lost",
                    None,
                    f"{exc.reason}: fallen off the bus or otherwise "
                    "inaccessible; "
                    "reboot the node to recover this GPU",
                )
            )
            return
        except Exception as exc:
            self.stats.sample_errors += 1
            key = type(exc).__name__
            if key not in state.logged:
                state.logged.add(key)
                self._log.warning("GPU %s: sample failed: %s: %s", device.index, key, exc)
            return
        if reading.errors:
            self.stats.field_errors += len(reading.errors)
            for error in reading.errors:
                column = error.split(":", 1)[0]
                if column not in state.logged:
                    state.logged.add(column)
                    self._log.info("GPU %s: %s", device.index, error)
        values = reading.values
        row = self._identity_columns(device, ts_ns)
        row.update(source=self.backend.sample_source, gpu_name=device.name)
        row.update(values)
        samples.append(row)

        elapsed = now - state.previous_t if state.previous_t is not None else None
        for change in sample_changes(state.previous, values, elapsed, self._thresholds):
            if change.kind == "recovery_action":
                if state.reported_recovery == change.code:
                    continue
                state.reported_recovery = change.code
            events.append(
                self._event_row(
                    device,
                    ts_ns,
                    self.backend.delta_source,
                    change.kind,
                    change.code,
                    change.message,
                )
            )
        action = values.get("recovery_action")
        if action == 0:
            state.reported_recovery = 0
        if (
            reading.reset_required
            and not state.reset_required
            and state.reported_recovery != RECOVERY_GPU_RESET
        ):
            state.reported_recovery = RECOVERY_GPU_RESET
            events.append(
                self._event_row(
                    device,
                    ts_ns,
                    self.backend.delta_source,
                    "recovery_action",
                    RECOVERY_GPU_RESET,
                    "NVML answers RESET_REQUIRED: GPU "
                    "recovery action "
                    f"{recovery_action_text(RECOVERY_GPU_RESET)}",
                )
            )
        state.reset_required = reading.reset_required
        state.previous = dict(values)
        state.previous_t = now
