"""Hostile and broken GPU-health input (issue 16): kernel-log lines that made the regexes backtrack
quadratically, one bad row that cost a whole poll, dcgm samples out of their column's range. Real
line formats (tests/test_kmsg.py, docs/reference/gpu-signals.md) and the real dcgm-exporter scrapes
of tests/data/gpu/."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.dcgm import DcgmParser, DcgmSource, read_scrape
from faultlens.collectors.sources.kmsg import KernelLogParser, KmsgSource, read_kernel_log
from faultlens.collectors.sources.source import NodeIdentity
from tests.conftest import DATA_DIR, REPO_ROOT

UTC = dt.UTC
NEW = DATA_DIR / "gpu" / "dcgm-exporter-new-names.prom"
OLD = DATA_DIR / "gpu" / "dcgm-exporter-old-names.prom"
IDENTITY = NodeIdentity("node-1")
XID_31 = ("NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr "
          "00000000. MMU Fault: "
          "ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE "
          "ACCESS_TYPE_VIRT_WRITE")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


# -- quadratic backtracking: 64 KB lines (the accepted maximum) of the shapes that made NAME_RE /
# CAUSED_BY_RE / RECOVERY_RE backtrack. Run in a child with a generous limit (the old code took 169
# s for one such line; the linear parser takes milliseconds), so a regression fails instead of
# hanging the suite.
ADVERSARIAL = {
    "name_padding": "NVRM: Xid (PCI:0000:2b:00): 31, pid=12, name=" + " " * 65_400 + "x",
    "name_padding_syslog": "Nov 30 11:55:41 gpu-node-07 kernel: [ 7983.002425] NVRM: Xid "
    "(PCI:0000:ab:00): 13, "
    "pid=7, name=" + "\t " * 32_650 + "y, Graphics Exception",
    "caused_by_padding": "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 "
    "caused by previous "
    "Xid 149" + " " * 65_300 + ".x",
    "caused_by_digits": "NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=p, caused by previous Xid "
    + "1" * 65_000
    + "z",
    "recovery_repeated": "NVRM: Xid (PCI:0018:01:00): 154, "
    + "recovery action changed from 0x4 (" * 1_900,
    "journal_name_padding": json.dumps(
        {
            "MESSAGE": "NVRM: Xid (PCI:0000:2b:00): 31, pid=1, name=" + " " * 65_000 + "z",
            "__REALTIME_TIMESTAMP": "1796000000000000",
        }
    ),
}


def test_64k_adversarial_lines_parse_in_linear_time():
    script = textwrap.dedent("""
        import json, sys
        from faultlens.collectors.sources.kmsg import KernelLogParser
        lines = json.loads(sys.stdin.read())
        parser = KernelLogParser()
        out = {
            name: [(e.kind, e.code) for e in parser.feed(line, 1)] for name, line in lines.items()
        }
        print(json.dumps({"events": out, "bad": parser.stats.bad_lines}))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(ADVERSARIAL),
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    events = {
        name: [tuple(event) for event in found]
        for name, found in json.loads(result.stdout)["events"].items()
    }
    assert all(len(line) <= 65_536 for line in ADVERSARIAL.values())
    # each is still read as the Xid it is (a padded name / message is not a reason to lose the
    # event)
    assert events["name_padding"] == [("xid", 31)]
    assert events["caused_by_padding"] == [("xid", 45)]
    assert events["recovery_repeated"][0] == ("xid", 154)


def test_recovery_action_with_a_leading_zero_is_read_found_by_the_fuzz_bench():
    events = KernelLogParser(tz=UTC).feed("NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action "
                                          "changed from 0x4 "
                                          "(Drain and Reset) to 01 (GPU Reset Required)")
    assert [(e.kind, e.code) for e in events] == [("xid", 154), ("recovery_action", 1)]


def test_name_and_caused_by_keep_their_meaning():
    parser = KernelLogParser(tz=UTC)
    (event,) = parser.feed("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3 , Ch "
                           "00000001 caused by "
                           "previous Xid 149 .")
    assert (event.pid, event.process_name, event.caused_by_xid) == (1818990, "python3", 149)
    assert event.message == "Ch 00000001 caused by previous Xid 149 ."
    (event,) = parser.feed("NVRM: Xid (PCI:0000:07:00): 13, pid=5, name=<unknown>")
    assert (event.process_name, event.message) == (None, "")
    (event,) = parser.feed("NVRM: Xid (PCI:0000:07:00): 13, pid=5, name=pt_main_thread, caused by "
                           "previous Xid 9 x")
    assert event.caused_by_xid is None


# -- one bad row must not cost the poll
# ----------------------------------------------------------------------------
def _syslog(n: int) -> str:
    return f"Nov 30 11:55:{n % 60:02d} gpu-node-07 kernel: [ {7983 + n}.002425] {XID_31}"


BAD_LINES = {
    "pid_20_digits": "Nov 30 11:56:00 gpu-node-07 kernel: [ 9000.1] NVRM: Xid (PCI:0000:00:07): "
                     "31, "
                     "pid=18446744073709551616, name=python3, Ch 00000008",
    "pid_past_int32": "Nov 30 11:56:00 gpu-node-07 kernel: [ 9000.1] NVRM: Xid (PCI:0000:00:07): "
                      "31, pid=4294967296, "
                      "name=python3, Ch 00000008",
    "journal_lone_surrogate": '{"MESSAGE": "NVRM: Xid (PCI:0000:00:07): 31, pid=1, name=p\\ud800, '
                              'Ch 00000008", '
                              '"__REALTIME_TIMESTAMP": "1796000000000000", "_HOSTNAME": '
                              '"gpu-node-07"}',
    "iso_year_9999": "9999-12-31T23:59:59.000000+00:00 gpu-node-07 kernel: " + XID_31,
    "dmesg_t_year_9999": "[Fri Dec 31 23:59:59 9999] " + XID_31,
    "journal_time_past_2262": '{"MESSAGE": "' + XID_31 + '", "__REALTIME_TIMESTAMP": '
                                                         '"99999999999999999999"}',
}


@pytest.mark.parametrize("bad", list(BAD_LINES))
def test_one_bad_line_is_dropped_and_counted_the_rest_of_the_poll_stored(tmp_path, bad):
    log_file = tmp_path / "kern.log"
    log_file.write_text("")
    source = KmsgSource(IDENTITY, log_file, tz=UTC, clock_ns=lambda: 1_796_000_000 * 10**9)
    assert source.poll() == {}
    lines = [_syslog(n) for n in range(1000)]
    lines.insert(500, BAD_LINES[bad])
    with log_file.open("a") as handle:
        handle.write("\n".join(lines) + "\n")
    batch = source.poll()["gpu_events"]
    assert batch.num_rows == 1000
    assert source.parser.stats.bad_lines == 1
    assert source.parser.stats.bad_examples[0][0] == 501  # the line number in what the source read
    source.close()


def test_ingest_kmsg_stores_the_good_lines_and_names_the_bad_one(tmp_path, store_dir):
    lines = [_syslog(n) for n in range(200)]
    for offset, bad in enumerate(BAD_LINES.values()):
        lines.insert(10 + offset * 20, bad)
    log_file = tmp_path / "kern.log"
    log_file.write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "ingest",
            "kmsg",
            str(log_file),
            "--utc",
            "--store",
            str(store_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"skipped {len(BAD_LINES)} bad line(s), first at line 11" in result.stderr
    with Store(store_dir) as store:
        assert store.query("SELECT count(*) AS n FROM gpu_events").to_pylist() == [{"n": 200}]


def test_read_kernel_log_counts_a_store_refused_row(tmp_path):
    imported = read_kernel_log(DATA_DIR / "gpu" / "node-kern.log", IDENTITY, tz=UTC)
    good = len(imported.rows)
    text = (DATA_DIR / "gpu" / "node-kern.log").read_text() + BAD_LINES["iso_year_9999"] + "\n"
    (tmp_path / "k.log").write_text(text)
    imported = read_kernel_log(tmp_path / "k.log", IDENTITY, tz=UTC)
    assert len(imported.rows) == good and imported.stats.bad_lines == 1
    assert imported.stats.bad_examples[0][0] == len(text.splitlines())


# -- dcgm: one sample out of range
# -----------------------------------------------------------------------------------
def _with_line(path, line: str) -> tuple[str, int]:
    lines = path.read_text().splitlines()
    lines.insert(3, line)
    return "\n".join(lines) + "\n", 4


OUT_OF_RANGE = {
    "sm_clock_3e9": 'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-3f1a9c2e-7b4d-4e0a-9c1f-2d8e6b5a4c01",'
    'pci_bus_id="00000000:18:00.0",hostname="gpu-node-07"} 3e9',
    "fb_free_-1e303": 'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-3f1a9c2e-7b4d-4e0a-9c1f-2d8e6b5a4c01",'
    'pci_bus_id="00000000:18:00.0",hostname="gpu-node-07"} -1e303',
    "power_-1e300": 'DCGM_FI_DEV_POWER_USAGE{gpu="1",'
    'UUID="GPU-8e2b7d41-0c5f-4a93-b6e2-71f0d3c9a802",'
    'pci_bus_id="00000000:2A:00.0",hostname="gpu-node-07"} -1e300',
    "energy_-inf": 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",'
    'UUID="GPU-8e2b7d41-0c5f-4a93-b6e2-71f0d3c9a802",'
    'pci_bus_id="00000000:2A:00.0",hostname="gpu-node-07"} -Inf',
    "timestamp_year_9999": 'DCGM_FI_DEV_GPU_TEMP{gpu="2",'
    'UUID="GPU-a65c1b07-94de-4f32-b8a0-3c7e2d6f1906",'
    'pci_bus_id="00000000:AB:00.0",hostname="gpu-node-07"} 50 '
    "253402300799000",
    "xid_1e12": 'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-e2f47a98-61b3-4d5c-9f0e-8a4b7c3d2e07",'
    'pci_bus_id="00000000:BA:00.0",hostname="gpu-node-07"} 1e12',
    "gpu_index_huge": 'DCGM_FI_DEV_GPU_TEMP{gpu="99999999999999",UUID="GPU-x",'
    'hostname="gpu-node-07"} 40',
}


@pytest.mark.parametrize("bad", list(OUT_OF_RANGE))
@pytest.mark.parametrize("path", [NEW, OLD], ids=["new-names", "old-names"])
def test_one_dcgm_sample_out_of_range_does_not_lose_the_scrape(tmp_path, path, bad):
    good_samples, _ = DcgmParser().parse(path.read_text(), IDENTITY, ts_ns=1_796_000_000 * 10**9)
    text, line_no = _with_line(path, OUT_OF_RANGE[bad])
    scrape = tmp_path / "scrape.prom"
    scrape.write_text(text)
    source = DcgmSource(IDENTITY, str(scrape), clock_ns=lambda: 1_796_000_000 * 10**9)
    batches = source.poll()
    assert batches["gpu_samples"].num_rows >= len(good_samples)
    stats = source.parser.stats
    # an unusable gpu label is only a GPU without an index, not a bad value
    if bad != "gpu_index_huge":
        assert stats.bad_lines == 1
        assert stats.bad_examples[0][0] == line_no


@pytest.mark.parametrize("bad", ["sm_clock_3e9", "fb_free_-1e303"])
def test_ingest_dcgm_never_prints_a_traceback(tmp_path, store_dir, bad):
    text, _ = _with_line(NEW, OUT_OF_RANGE[bad])
    (tmp_path / "scrape.prom").write_text(text)
    samples, _, _ = read_scrape(str(tmp_path / "scrape.prom"), IDENTITY)
    assert len(samples) == 4
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "ingest",
            "dcgm",
            str(tmp_path / "scrape.prom"),
            "--store",
            str(store_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "Traceback" not in result.stderr
        and "skipped 1 bad line(s), first at line 4" in result.stderr
    )


NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from(
        [
            "-1e303",
            "1e308",
            "3e9",
            "NaN",
            "+Inf",
            "-Inf",
            "9223372036854775807",
            "-9223372036854775809",
            "0x10",
            "1e-400",
        ]
    ),
)
METRICS = [
    "SM_CLOCK",
    "MEM_CLOCK",
    "FB_FREE",
    "FB_USED",
    "FB_RESERVED",
    "FB_TOTAL",
    "POWER_USAGE",
    "GPU_TEMP",
    "XID_ERRORS",
    "GET_GPU_RECOVERY_ACTION",
    "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "TOTAL_ENERGY_CONSUMPTION",
    "ROW_REMAP_PENDING",
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(METRICS), NUMBER, st.sampled_from(["0", "1", "x", "99999999999"])
        ),
        min_size=1,
        max_size=8,
    )
)
def test_fuzz_dcgm_values_parse_never_raises_and_rows_always_store(samples):
    text = "".join(
        f'DCGM_FI_DEV_{name}{{gpu="{gpu}",UUID="GPU-{gpu}"}} {value}\n'
        for name, value, gpu in samples
    )
    text += 'DCGM_EXP_XID_ERRORS_COUNT{gpu="0",UUID="GPU-0",xid="48",window_size_in_ms="60000"} 2\n'
    parser = DcgmParser()
    rows, events = parser.parse(text, IDENTITY, ts_ns=1_796_000_000 * 10**9)
    from faultlens.collectors.store.batches import rows_to_batch

    rows_to_batch("gpu_samples", rows)  # every row the parser returns fits the table
    rows_to_batch("gpu_events", events)
