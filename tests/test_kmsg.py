"""Kernel-log parser and source: golden tests from the real lines of docs/reference/gpu-signals.md,
every Xid form the issue lists, the transports (kmsg records, journalctl JSON, syslog, dmesg),
fuzzing, and the file source."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.gpu_backend import GpuDevice
from faultlens.collectors.sources.kmsg import (
    KernelLogFileError,
    KernelLogParser,
    KmsgSource,
    read_kernel_log,
)
from faultlens.collectors.sources.source import NodeIdentity
from tests.conftest import DATA_DIR, REPO_ROOT

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()


def parse(lines, **kwargs):
    parser = KernelLogParser(tz=UTC, now=lambda: NOW, **kwargs)
    return parser, parser.feed_lines(lines)


# (line, code, NVML bus id, pid, process name, message): the "Real examples" block of the reference,
# verbatim
REAL_LINES = [
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
     79, "00000000:2B:00.0", None, None, "GPU has fallen off the bus."),
    ("NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
     "error (DBE) has "
     "been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
     48, "00000000:07:00.0", None, None, "An uncorrectable double bit error (DBE) has been "
                                         "detected on GPU in the "
     "framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1."),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset "
     "gpu to activate.",
     63, "00000000:10:1C.0", 1896, None, "Row Remapper: New row marked for remapping, reset gpu to "
                                         "activate."),
    ("NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: "
     "No, D-RST: No",
     94, "00000000:00:08.0", None, None, "Contained: SM (0x1). RST: No, D-RST: No"),
    ("NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. "
     "MMU Fault: ENGINE "
     "GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE "
     "ACCESS_TYPE_VIRT_WRITE",
     31, "00000000:00:07.0", 2512125, "python3.10", "Ch 00000008, intr 00000000. MMU Fault: ENGINE "
                                                    "GRAPHICS "
     "GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE"),
    ("NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString "
     "CTX SWITCH "
     "TIMEOUT, Info 0x58005",
     109, "00000000:CB:00.0", 1797828, "pt_main_thread", "Ch 00000008, errorString CTX SWITCH "
                                                         "TIMEOUT, Info 0x58005"),
    ("NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting "
     "for RPC response "
     "from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
     119, "00000000:9B:00.0", 2024380, "nvidia-smi", "Timeout after 6s of waiting for RPC response "
                                                     "from GPU4 GSP! "
     "Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4)."),
    ("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous "
     "Xid 149",
     45, "00000000:DC:00.0", 1818990, "python3", "Ch 00000001 caused by previous Xid 149"),
    ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 09 (0x004525c6 0x00000000 "
     "…)",
     149, "00000018:01:00.0", None, None, "NETIR_LINK_EVT Fatal XC0 i0 Link 09 (0x004525c6 "
                                          "0x00000000 …)"),
    ("NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to "
     "0x1 (GPU Reset "
     "Required)",
     154, "00000018:01:00.0", None, None, "GPU recovery action changed from 0x4 (Drain and Reset) "
                                          "to 0x1 (GPU Reset "
     "Required)"),
]


@pytest.mark.parametrize(("line", "code", "pci", "pid", "name", "message"), REAL_LINES,
                         ids=[f"xid{case[1]}" for case in REAL_LINES])
def test_golden_real_lines(line, code, pci, pid, name, message):
    parser, events = parse([line])
    xid = [e for e in events if e.kind == "xid"]
    assert len(xid) == 1
    event = xid[0]
    assert (event.code, event.pci_bus_id, event.pid, event.process_name, event.message) == (
        code,
        pci,
        pid,
        name,
        message,
    )
    assert event.raw == line
    assert parser.stats.bad_lines == 0


@pytest.mark.parametrize(("line", "derived_kind", "derived_code"), [
    (REAL_LINES[0][0], "gpu_lost", None),
    (REAL_LINES[1][0], "ecc_dbe", None),
    (REAL_LINES[2][0], "remap_pending", None),
    (REAL_LINES[9][0], "recovery_action", 1),
    ("NVRM: Xid (PCI:0000:3b:00): 64, pid='<unknown>', name=<unknown>, Row Remapper Error: "
     "(0x000000000000abcd) - "
     "All reserved rows for bank are remapped", "remap_failure", None),
    ("NVRM: Xid (PCI:0000:3b:00): 63, pid=12, name=x, Dynamic Page Retirement: New page retired, "
     "reboot to activate",
     "retired_page_pending", None),
])
def test_xids_that_state_a_gpu_condition_also_give_its_kind(line, derived_kind, derived_code):
    _, events = parse([line])
    assert [e.kind for e in events] == ["xid", derived_kind]
    assert events[1].code == derived_code
    assert events[1].pci_bus_id == events[0].pci_bus_id and events[1].raw == line


def test_no_derived_kind_for_other_xids():
    _, events = parse([REAL_LINES[4][0], REAL_LINES[7][0]])
    assert [e.kind for e in events] == ["xid", "xid"]


def test_caused_by_previous_xid():
    _, events = parse([REAL_LINES[7][0]])
    assert events[0].caused_by_xid == 149


def test_very_old_driver_without_pci_prefix():
    _, events = parse(["NVRM: Xid (0000:01:00): 31, Ch 00000001, engmask 00000101, intr 10000000"])
    assert (events[0].code, events[0].pci_bus_id, events[0].pid) == (31, "00000000:01:00.0", None)
    assert events[0].message == "Ch 00000001, engmask 00000101, intr 10000000"


@pytest.mark.parametrize(("line", "gi", "ci"), [
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=4242, name=python, Ch 00000010", 2, 1),
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 31, pid=77, name=python, Ch 00000011, intr 0", 5, None),
])
def test_mig_instances(line, gi, ci):
    _, events = parse([line])
    assert (events[0].gpu_instance_id, events[0].compute_instance_id) == (gi, ci)
    assert events[0].pci_bus_id == "00000000:3B:00.0"


def test_pid_without_quotes_and_unknown_forms():
    _, events = parse(["NVRM: Xid (PCI:0000:07:00): 13, pid=<unknown>, name=<unknown>, Graphics "
                       "Exception"])
    assert (events[0].pid, events[0].process_name, events[0].message) == (
        None,
        None,
        "Graphics Exception",
    )


def test_nvswitch_sxid_and_its_continuation_lines():
    lines = [
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 46 egress non-posted "
        "PRIV error (First)",
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 46 "
        "Sub-engine instance 00",
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000, 0x00000000, "
        "0x00000000}",
    ]
    parser, events = parse(lines)
    assert len(events) == 1
    assert (events[0].kind, events[0].code, events[0].pci_bus_id, events[0].device) == (
        "sxid", 12028, "00000000:05:00.0", "nvidia-nvswitch3")
    assert events[0].message.startswith("Non-fatal, Link 46")
    assert parser.stats.bad_lines == 0


def test_fallen_off_the_bus_without_xid():
    _, events = parse(["NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."])
    assert [(e.kind, e.code, e.pci_bus_id) for e in events] == [
        ("gpu_lost", None, "00000000:18:00.0")
    ]


def test_fallen_off_the_bus_multi_line_form():
    lines = ["NVRM: The NVIDIA GPU 0000:3b:00.0", "NVRM: (PCI ID: 10de:2330) installed in this "
                                                  "system has",
             "NVRM: fallen off the bus and is not responding to commands."]
    _, events = parse(lines)
    assert [(e.kind, e.pci_bus_id) for e in events] == [("gpu_lost", "00000000:3B:00.0")]
    assert "not responding to commands" in events[0].message


def test_xid_79_then_fallen_line_is_one_incident():
    _, events = parse([REAL_LINES[0][0], "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus."])
    assert [e.kind for e in events] == ["xid", "gpu_lost"]


def test_uuid_line_is_remembered_for_later_xids():
    _, events = parse(["NVRM: GPU at PCI:0000:2b:00: GPU-6a6d8d8f-1c2b-4f6e-9e0f-123456789abc",
                       "NVRM: GPU Board Serial Number: 1654423012345", REAL_LINES[0][0]])
    assert events[0].gpu_uuid == "GPU-6a6d8d8f-1c2b-4f6e-9e0f-123456789abc"


def test_transports_and_timestamps():
    boot = 1_796_000_000_000_000_000
    line = REAL_LINES[0][0]
    journal = json.dumps(
        {
            "MESSAGE": line,
            "__REALTIME_TIMESTAMP": "1796040000123456",
            "_HOSTNAME": "node-3",
            "_TRANSPORT": "kernel",
        }
    )
    journal_bytes = json.dumps(
        {"MESSAGE": list(line.encode()), "__REALTIME_TIMESTAMP": "1796040001000000"}
    )
    lines = [
        f"4,2231,9123456789,-;{line}",
        journal,
        journal_bytes,
        f"Nov 30 11:58:01 gpu-node-07 kernel: [ 8123.456789] {line}",
        f"2026-11-30T11:58:02.250000+00:00 gpu-node-08 kernel: {line}",
        f"[Mon Nov 30 11:58:03 2026] {line}",
        f"[ 8123.500000] {line}",
        " SUBSYSTEM=pci",
    ]
    parser = KernelLogParser(boot_time_ns=boot, tz=UTC, now=lambda: NOW)
    xids = [e for e in parser.feed_lines(lines) if e.kind == "xid"]
    stamps = [(e.ts_ns, e.host) for e in xids]
    noon = dt.datetime(2026, 11, 30, 11, 58, tzinfo=UTC).timestamp()
    assert stamps == [
        (boot + 9123456789 * 1000, None),
        (1796040000123456000, "node-3"),
        (1796040001000000000, None),
        (int(noon + 1) * 10**9, "gpu-node-07"),
        (int((noon + 2.25) * 1e6) * 1000, "gpu-node-08"),
        (int(noon + 3) * 10**9, None),
        (boot + 8123500000000, None),
    ]
    assert parser.stats.bad_lines == 0


def test_syslog_year_is_last_year_for_a_future_date():
    parser = KernelLogParser(tz=UTC, now=lambda: dt.datetime(2027, 1, 2, tzinfo=UTC).timestamp())
    (event, _) = parser.feed(f"Dec 31 23:59:59 n1 kernel: {REAL_LINES[0][0]}")
    assert dt.datetime.fromtimestamp(event.ts_ns / 1e9, UTC).year == 2026


def test_bad_lines_are_counted_and_skipped():
    lines = [
        "NVRM: Xid (PCI:zzzz:00:00): 79, broken",
        '{"MESSAGE": "NVRM: Xid (PCI',
        REAL_LINES[4][0],
        "NVRM: Xid (PCI:0000:2b:00): 31, pid=abc, name=x, y",
        "completely unrelated line",
    ]
    parser, events = parse(lines)
    # an Xid whose PCI id is not one is kept without it (the node still had the error)
    assert [(e.kind, e.code, e.pci_bus_id) for e in events] == [
        ("xid", 79, None),
        ("gpu_lost", None, None),
        ("xid", 31, "00000000:00:07.0"),
    ]
    assert events[0].raw == lines[0]
    assert parser.stats.bad_lines == 2
    assert parser.stats.ignored == 1
    assert [n for n, _ in parser.stats.bad_examples] == [2, 4]


# -- fuzzing
# ------------------------------------------------------------
_FRAGMENTS = st.sampled_from(
    [
        "NVRM: ",
        "Xid ",
        "(PCI:",
        "0000:2b:00",
        "GPU-I:",
        ") ",
        "): ",
        "79",
        ", ",
        "pid=",
        "'<unknown>'",
        "name=",
        "<unknown>",
        "SXid",
        "fallen off the bus",
        "{",
        "}",
        '"MESSAGE"',
        ":",
        "[",
        "]",
        "6,1,2,-;",
        "caused by previous Xid ",
        "recovery action changed from ",
        "0x",
        " to ",
        "The NVIDIA GPU ",
        "\x00",
        "é",
        "\ud800",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(max_size=200), st.lists(_FRAGMENTS, max_size=20).map("".join)),
        max_size=30,
    )
)
def test_fuzz_text_lines_never_raise(lines):
    parser = KernelLogParser(boot_time_ns=0, tz=UTC, now=lambda: NOW)
    events = parser.feed_lines(lines)
    stats = parser.stats
    assert stats.lines == len(lines)
    assert stats.bad_lines + stats.ignored <= stats.lines
    for event in events:
        assert event.kind in {
            "xid",
            "sxid",
            "gpu_lost",
            "ecc_dbe",
            "remap_pending",
            "remap_failure",
            "retired_page_pending",
            "recovery_action",
        }
        assert event.pci_bus_id is None or len(event.pci_bus_id) == 16


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=20),
    st.integers(min_value=0, max_value=len(REAL_LINES) - 1),
)
def test_fuzz_bytes_around_a_good_line(garbage, which):
    line = REAL_LINES[which][0]
    parser = KernelLogParser(tz=UTC, now=lambda: NOW)
    events = parser.feed_lines([*garbage, line.encode(), *garbage])
    assert REAL_LINES[which][1] in [e.code for e in events if e.kind == "xid"]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(REAL_LINES) - 1),
    st.integers(min_value=0, max_value=200),
    st.text(max_size=5),
)
def test_fuzz_mutated_xid_lines(which, position, insert):
    line = REAL_LINES[which][0]
    position = min(position, len(line))
    parser = KernelLogParser(tz=UTC, now=lambda: NOW)
    parser.feed_lines([line[:position] + insert + line[position:], line[:position]])
    assert parser.stats.lines == 2


# -- the source
# ------------------------------------------------------------
def test_file_source_follows_appends_and_truncation(tmp_path):
    log_file = tmp_path / "kern.log"
    log_file.write_text("old line before the agent\n" + REAL_LINES[3][0] + "\n")
    devices = [GpuDevice(index=4, uuid="GPU-1234", pci_bus_id="00000000:2B:00.0")]
    source = KmsgSource(
        NodeIdentity("node-1"), log_file, devices=devices, clock_ns=lambda: 1_796_000_000 * 10**9
    )
    assert source.poll() == {}  # starts at the end by default
    with log_file.open("a") as handle:
        # a partial line is kept for later
        handle.write(REAL_LINES[0][0] + "\n" + REAL_LINES[4][0][:30])
    rows = source.poll()["gpu_events"].to_pylist()
    assert [
        (r["kind"], r["code"], r["gpu_index"], r["gpu_uuid"], r["source"], r["node"]) for r in rows
    ] == [
        ("xid", 79, 4, "GPU-1234", "kmsg", "node-1"),
        ("gpu_lost", None, 4, "GPU-1234", "kmsg", "node-1"),
    ]
    with log_file.open("a") as handle:
        handle.write(REAL_LINES[4][0][30:] + "\n")
    assert source.poll()["gpu_events"].column("code").to_pylist() == [31]
    log_file.write_text(REAL_LINES[5][0] + "\n")  # truncated (logrotate copytruncate)
    assert source.poll()["gpu_events"].column("code").to_pylist() == [109]
    source.close()


def test_file_source_from_start_and_missing_file(tmp_path, caplog):
    missing = KmsgSource(NodeIdentity("n"), tmp_path / "absent.log")
    assert missing.poll() == {} and missing.poll() == {}
    assert sum("unavailable" in r.getMessage() for r in caplog.records) == 1
    path = DATA_DIR / "gpu" / "node-kern.log"
    source = KmsgSource(NodeIdentity("n"), path, from_start=True, tz=UTC)
    kinds = source.poll()["gpu_events"].column("kind").to_pylist()
    assert kinds == [
        "xid",
        "ecc_dbe",
        "xid",
        "remap_pending",
        "xid",
        "recovery_action",
        "xid",
        "gpu_lost",
    ]


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable here")
def test_real_dev_kmsg_reads_without_error():
    source = KmsgSource(NodeIdentity("n"), "/dev/kmsg", from_start=True)
    for _ in range(3):
        result = source.poll()
        assert set(result) <= {"gpu_events"}
    assert source.parser.stats.lines > 0 or source._unavailable is not None
    source.close()


def test_read_kernel_log_file_errors(tmp_path):
    with pytest.raises(KernelLogFileError, match=r"kmsg .*absent\.log: cannot read"):
        read_kernel_log(tmp_path / "absent.log", NodeIdentity("n"))
    with pytest.raises(KernelLogFileError, match="is a directory"):
        read_kernel_log(tmp_path, NodeIdentity("n"))
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x00\x00\x01")
    with pytest.raises(KernelLogFileError, match=r"core: binary data"):
        read_kernel_log(binary, NodeIdentity("n"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"MESSAGE": "NVRM: Xid (PCI\n{"MESSAGE": 12, "x": "NVRM"}\n')
    with pytest.raises(KernelLogFileError, match=r"bad\.json: no GPU event could be read: 2 bad "
                                                 r"line\(s\), first at "
                                                 r"line 1: not a JSON object"):
        read_kernel_log(bad, NodeIdentity("n"))


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )


def test_cli_ingest_kmsg_then_query_the_store(store_dir, tmp_path):
    log_file = tmp_path / "kern.log"
    # an Xid whose PCI id is not one is kept without it; an unreadable pid is a bad line
    log_file.write_text(
        (DATA_DIR / "gpu" / "node-kern.log").read_text()
        + "Nov 30 11:56:05 gpu-node-07 kernel: NVRM: Xid (PCI:zz): 1, x\n"
        + "Nov 30 11:56:05 gpu-node-07 kernel: NVRM: Xid (PCI:0000:2b:00): 31, pid=abc, y\n"
    )
    result = _cli("ingest", "kmsg", str(log_file), "--store", str(store_dir), "--utc")
    assert result.returncode == 0, result.stderr
    assert "9 GPU events" in result.stdout
    assert "skipped 1 bad line(s), first at line 16" in result.stderr
    rows = Store(store_dir).query("SELECT node, kind, code, pci_bus_id, gpu_uuid, pid, "
                                  "process_name, ts "
                                  "FROM gpu_events ORDER BY ts, kind").to_pylist()
    assert {r["node"] for r in rows} == {"gpu-node-07"}
    lost = next(r for r in rows if r["code"] == 79)
    assert lost["pci_bus_id"] == "00000000:5D:00.0"
    assert lost["gpu_uuid"] == "GPU-19ab5f62-e3c7-4d08-a54b-6f2c8e0d7b04"
    today = dt.datetime.now(UTC)
    # syslog lines carry no year
    year = today.year if (today.month, today.day) >= (11, 30) else today.year - 1
    assert lost["ts"] == dt.datetime(year, 11, 30, 11, 56, 3, tzinfo=UTC)
    remap = next(r for r in rows if r["code"] == 63)
    assert (remap["pid"], remap["process_name"]) == (48213, "pt_main_thread")


def test_cli_ingest_kmsg_bad_file(store_dir, tmp_path):
    result = _cli("ingest", "kmsg", str(tmp_path / "nope.log"), "--store", str(store_dir))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "nope.log: cannot read" in result.stderr
