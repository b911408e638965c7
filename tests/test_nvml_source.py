"""The NVML source over the recorded backend (stepped clock), the real pynvml backend's error
mapping and API use, health deltas, and timeline validation."""

from __future__ import annotations

import ctypes
import logging
import re
import time
from pathlib import Path

import pynvml
import pytest
import yaml

from faultlens.collectors.sources.gpu_backend import (
    SAMPLE_COLUMNS,
    GpuBackend,
    GpuDevice,
    GpuLostError,
    GpuReading,
)
from faultlens.collectors.sources.gpu_deltas import sample_changes
from faultlens.collectors.sources.nvml_backend import NvmlBackend, field_value
from faultlens.collectors.sources.nvml_source import NvmlSource
from faultlens.collectors.sources.recorded_backend import (
    RecordedBackend,
    RecordedTimelineError,
    load_timeline,
)
from faultlens.collectors.sources.source import NodeIdentity
from tests.conftest import DATA_DIR, REPO_ROOT

TIMELINE = DATA_DIR / "gpu" / "timeline-8gpu.yaml"


class SteppedClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_source(events: bool = False):
    clock = SteppedClock()
    backend = RecordedBackend(TIMELINE, clock=clock)
    source = NvmlSource(backend, NodeIdentity("gpu-node-07", job_id="job-1"), monotonic=clock,
                        clock_ns=lambda: int(1_796_000_000e9 + clock.t * 1e9), events=events)
    return clock, backend, source


def kinds(result):
    if "gpu_events" not in result:
        return []
    return [(r["gpu_index"], r["kind"], r["code"]) for r in result["gpu_events"].to_pylist()]


def test_both_backends_implement_the_interface():
    assert isinstance(NvmlBackend(), GpuBackend)
    assert isinstance(RecordedBackend(TIMELINE), GpuBackend)


def test_recorded_timeline_through_the_source():
    clock, _, source = make_source()
    first = source.poll()
    samples = first["gpu_samples"].to_pylist()
    assert [s["gpu_index"] for s in samples] == list(range(8))
    assert {s["source"] for s in samples} == {"recorded"}
    assert samples[3]["pci_bus_id"] == "00000000:5D:00.0" and samples[3]["gpu_uuid"].startswith(
        "GPU-19ab5f62"
    )
    assert samples[0]["retired_pages_sbe"] is None  # NOT_SUPPORTED on Hopper -> null
    assert samples[0]["job_id"] == "job-1" and samples[0]["node"] == "gpu-node-07"
    assert kinds(first) == []
    clock.t = 0.6
    assert kinds(source.poll()) == [(6, "thermal_slowdown_start", None)]
    clock.t = 1.2
    assert kinds(source.poll()) == [
        (5, "ecc_dbe", None),
        (5, "remap_pending", None),
        (5, "recovery_action", 1),
    ]
    clock.t = 1.6
    result = source.poll()
    assert kinds(result) == [(3, "gpu_lost", None)]
    assert result["gpu_samples"].num_rows == 7
    assert 3 not in result["gpu_samples"].column("gpu_index").to_pylist()
    for step in (2.0, 3.0):
        clock.t = step
        result = source.poll()
        assert result["gpu_samples"].num_rows == 7 and kinds(result) == []
    assert source.stats.lost_gpus == 1
    source.close()


def test_event_thread_delivers_xids_without_duplicating_the_recovery_action():
    clock, _, source = make_source(events=True)
    source.poll()
    clock.t = 1.2
    collected = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        collected += kinds(source.poll())
        if (5, "xid", 154) in collected:
            break
        time.sleep(0.05)
    source.close()
    assert [k for k in collected if k[1] == "xid"] == [
        (5, "xid", 48),
        (5, "xid", 63),
        (5, "xid", 154),
    ]
    assert [k for k in collected if k[1] == "recovery_action"] == [(5, "recovery_action", 1)]


def test_no_gpu_here_says_nvml_unavailable_once(caplog):
    caplog.set_level(logging.WARNING, logger="faultlens.collectors.nvml")
    source = NvmlSource(NvmlBackend(), NodeIdentity("n"), retry_open_s=0.0)
    for _ in range(3):
        assert source.poll() == {}
    assert source.devices() == []
    messages = [r.getMessage() for r in caplog.records if "NVML unavailable" in r.getMessage()]
    assert messages == ["NVML unavailable: NVML Shared Library Not Found"]
    source.close()


# -- the real pynvml backend: its error mapping with pynvml's own exceptions and structures
# --------------------------
def test_not_supported_becomes_none_lost_raises_reset_marks():
    backend = NvmlBackend(pynvml)
    device = GpuDevice(index=2, pci_bus_id="00000000:3A:00.0")
    reading = GpuReading(values={})

    def raises(code):
        def query(*args, **kwargs):
            raise pynvml.NVMLError(code)
        return query

    assert (
        backend._call(reading, device, "hbm_temp_c", raises(pynvml.NVML_ERROR_NOT_SUPPORTED))
        is None
    )
    assert backend._call(reading, device, "x", raises(pynvml.NVML_ERROR_NO_PERMISSION)) is None
    assert reading.errors == [] and not reading.reset_required
    assert (
        backend._call(reading, device, "temp_c", raises(pynvml.NVML_ERROR_RESET_REQUIRED)) is None
    )
    assert reading.reset_required
    assert backend._call(reading, device, "power_w", raises(pynvml.NVML_ERROR_UNKNOWN)) is None
    assert reading.errors == ["power_w: Unknown Error"]
    with pytest.raises(GpuLostError) as caught:
        backend._call(reading, device, "temp_c", raises(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert caught.value.device is device and "GPU is lost" in str(caught.value)
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), pynvml.NVMLError_GpuIsLost)


@pytest.mark.parametrize(("value_type", "member", "raw", "expected"), [
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 61.5, 61.5),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 71, 71),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**40 + 3, 2**40 + 3),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -5, -5),
    (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", 2, 2),
])
def test_field_value_union_decoding(value_type, member, raw, expected):
    field = pynvml.c_nvmlFieldValue_t()
    field.fieldId = pynvml.NVML_FI_DEV_MEMORY_TEMP
    field.valueType = value_type
    setattr(field.value, member, raw)
    assert field_value(pynvml, field) == expected


def test_every_pynvml_name_the_backend_uses_exists():
    source = "".join((REPO_ROOT / "collectors" / "sources" / name).read_text()
                     for name in ("nvml_backend.py", "nvml_sampling.py"))
    names = set(re.findall(r"\bnvml\.(\w+)", source)) | set(re.findall(r'fn\("(\w+)"\)', source))
    names |= set(re.findall(r'"(NVML_\w+)"', source))
    # fallback for old bindings, removed in CUDA 14
    optional = {"nvmlDeviceGetCurrentClocksThrottleReasons"}
    missing = sorted(name for name in names - optional if not hasattr(pynvml, name))
    assert names and missing == []
    # 13.x: the recovery-action event is registered
    assert hasattr(pynvml, "nvmlEventTypeGpuRecoveryAction")


def test_event_device_handles_map_back_to_indexes():
    backend = NvmlBackend(pynvml)
    handle = ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlDevice_t)
    backend._by_address[0x1000] = 6
    backend._event_types = {pynvml.nvmlEventTypeXidCriticalError: "xid",
                            pynvml.nvmlEventTypeGpuRecoveryAction: "recovery_action"}
    data = pynvml.c_nvmlEventData_t()
    data.device = handle
    data.eventType = pynvml.nvmlEventTypeXidCriticalError
    data.eventData = 79
    data.gpuInstanceId = pynvml.NVML_GPU_INSTANCE_ID_ANY
    data.computeInstanceId = pynvml.NVML_COMPUTE_INSTANCE_ID_ANY
    event = backend._event(data)
    assert (event.gpu_index, event.kind, event.code, event.gpu_instance_id) == (6, "xid", 79, None)
    data.eventType = pynvml.nvmlEventTypeGpuRecoveryAction
    data.eventData = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    data.gpuInstanceId = 3
    event = backend._event(data)
    assert (event.kind, event.code) == ("recovery_action", 2)
    assert "Node Reboot Required" in event.message and "MIG GPU-I 3" in event.message


# -- deltas
# --------------------------------------------------------------------------------------------------
def base(**values):
    row = {column: 0 for column in SAMPLE_COLUMNS}
    row.update(remap_pending=False, remap_failure=False, retired_pages_pending=False, temp_c=60.0)
    row.update(values)
    return row


@pytest.mark.parametrize(
    ("prev", "cur", "elapsed", "expected"),
    [
        (
            base(clocks_event_reasons=0x40),
            base(clocks_event_reasons=0),
            1.0,
            ["thermal_slowdown_end"],
        ),
        (base(), base(clocks_event_reasons=0x80), 1.0, ["power_slowdown_start"]),
        (base(), base(clocks_event_reasons=0x4), 1.0, []),  # SwPowerCap alone: normal at full load
        (
            base(clocks_event_reasons=0x80),
            base(clocks_event_reasons=0x0),
            1.0,
            ["power_slowdown_end"],
        ),
        (base(), base(ecc_sbe_volatile=5000), 1.0, ["ecc_sbe_storm"]),
        (base(), base(ecc_sbe_volatile=10), 1.0, []),
        (base(), base(nvlink_replay_errors=1), 1.0, ["nvlink_error"]),
        (base(), base(nvlink_crc_errors=150), 1.0, ["nvlink_error"]),
        (base(), base(nvlink_crc_errors=150), 10.0, []),
        (base(), base(pcie_replay_count=7), 1.0, ["pcie_replay"]),
        (base(), base(remap_failure=True), 1.0, ["remap_failure"]),
        (base(), base(retired_pages_pending=True), 1.0, ["retired_page_pending"]),
        (base(ecc_dbe_aggregate=2), base(ecc_dbe_aggregate=2), 1.0, []),
        (
            base(ecc_dbe_volatile=None, ecc_dbe_aggregate=1),
            base(ecc_dbe_volatile=None, ecc_dbe_aggregate=2),
            1.0,
            ["ecc_dbe"],
        ),
        (base(recovery_action=2), base(recovery_action=0), 1.0, []),
        (
            None,
            base(
                ecc_dbe_aggregate=9,
                ecc_sbe_volatile=999999,
                recovery_action=4,
                clocks_event_reasons=0x20,
            ),
            None,
            ["recovery_action", "thermal_slowdown_start"],
        ),
        (None, base(ecc_dbe_volatile=2), None, ["ecc_dbe"]),
    ],
)
def test_sample_changes(prev, cur, elapsed, expected):
    assert [c.kind for c in sample_changes(prev, cur, elapsed)] == expected


def test_sram_dbe_is_located():
    [change] = sample_changes(base(), base(ecc_dbe_volatile=1, ecc_sram_uncorrected=1), 1.0)
    assert change.message.endswith("in SRAM")


# -- timeline validation
# ----------------------------------------------------------------------------------------------
def test_timeline_file_is_valid_and_realistic():
    document = load_timeline(TIMELINE)
    assert len(document["gpus"]) == 8
    assert {s["gpu"] for s in document["timeline"]} == {3, 5, 6}


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda d: d["gpus"][0]["values"].update(temp_c="hot"),
     "gpus[0].values.temp_c: expected a valid number, got 'hot'"),
    (lambda d: d["defaults"].update(fan_rpm=3), "defaults.fan_rpm: unknown key (not allowed here)"),
    (lambda d: d["timeline"][0].update(gpu=9), "timeline[0].gpu: expected one of the GPU indexes "
                                               "[0, 1, 2, 3, 4, "),
    (lambda d: d["timeline"][1]["event"].update(kind="meltdown"), "timeline[1].event.kind: "
                                                                  "expected one of "),
    (lambda d: d["gpus"][1].update(pci_bus_id="nowhere"), "gpus[1].pci_bus_id: expected a PCI "
                                                          "address"),
    (lambda d: d.update(format_version=7), "format_version: expected 1, got 7"),
])
def test_bad_timeline_names_file_key_and_expectation(tmp_path, mutate, expected):
    document = yaml.safe_load(TIMELINE.read_text())
    mutate(document)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(RecordedTimelineError) as caught:
        RecordedBackend(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert expected in str(caught.value)


def test_timeline_not_yaml(tmp_path):
    path = Path(tmp_path / "t.yaml")
    path.write_text("gpus: [\n")
    with pytest.raises(
        RecordedTimelineError, match=r"t\.yaml: line \d+, column \d+: not valid YAML"
    ):
        load_timeline(path)
