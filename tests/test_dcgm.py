"""dcgm-exporter scrapes: old and new metric names, blank sentinels, host labels, events, fuzzing, a
real HTTP server on 127.0.0.1, and the `faultlens ingest dcgm` command."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.dcgm import DcgmFetchError, DcgmParser, DcgmSource, read_scrape
from faultlens.collectors.sources.source import NodeIdentity
from tests.conftest import DATA_DIR, REPO_ROOT

OLD = DATA_DIR / "gpu" / "dcgm-exporter-old-names.prom"
NEW = DATA_DIR / "gpu" / "dcgm-exporter-new-names.prom"
IDENTITY = NodeIdentity("fallback-node")


def by_gpu(rows):
    return {row["gpu_index"]: row for row in rows}


@pytest.mark.parametrize("path", [OLD, NEW], ids=["old-names", "new-names"])
def test_samples_from_both_name_generations(path):
    samples, _, stats = read_scrape(str(path), IDENTITY)
    rows = by_gpu(samples)
    assert sorted(rows) == [0, 1, 2, 3]
    gpu = rows[2]
    assert gpu["node"] == "gpu-node-07"  # from the Hostname / hostname label
    assert gpu["gpu_uuid"] == "GPU-a65c1b07-94de-4f32-b8a0-3c7e2d6f1906"
    assert gpu["pci_bus_id"] == "00000000:AB:00.0"
    assert gpu["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["source"] == "dcgm"
    assert (gpu["sm_clock_mhz"], gpu["temp_c"], gpu["power_w"], gpu["energy_mj"]) == (
        1980,
        59.0,
        633.2,
        93123456789,
    )
    assert gpu["mem_used_bytes"] == 70911 * 1024 * 1024
    assert gpu["mem_total_bytes"] == (9491 + 70911 + 1157) * 1024 * 1024
    assert (gpu["ecc_dbe_volatile"], gpu["remapped_rows_uncorrectable"], gpu["remap_failure"]) == (
        1,
        1,
        False,
    )
    # CLOCK_THROTTLE_REASONS (old) / CLOCKS_EVENT_REASONS (new)
    assert rows[3]["clocks_event_reasons"] == 0x60
    assert rows[1]["hbm_temp_c"] is None  # 9223372036854775794: DCGM blank
    assert all(row["retired_pages_pending"] is None for row in samples)  # blank for every GPU
    assert stats.bad_lines == 0
    assert stats.blank_values == 5


def test_events_old_names():
    _, events, _ = read_scrape(str(OLD), IDENTITY)
    assert sorted((e["gpu_index"], e["kind"], e["code"]) for e in events) == [
        (2, "ecc_dbe", None), (2, "xid", 48), (3, "thermal_slowdown_start", None)]
    xid = next(e for e in events if e["kind"] == "xid")
    assert xid["message"] == "Double Bit ECC Error" and xid["source"] == "dcgm"


def test_events_new_names_count_and_health():
    _, events, _ = read_scrape(str(NEW), IDENTITY)
    assert sorted(
        (e["gpu_index"], e["kind"], e["code"], e["message"]) for e in events if e["gpu_index"] == 2
    ) == [
        (
            2,
            "ecc_dbe",
            None,
            "1 volatile double-bit ECC error(s) since the last GPU reset (present at first sample)",
        ),
        (2, "ecc_dbe", None, "DCGM health MEM FAIL: DCGM_FR_VOLATILE_DBE_DETECTED"),
        (2, "remap_pending", None, "DCGM health MEM WARN: DCGM_FR_PENDING_ROW_REMAP"),
        (2, "xid", 48, "1 Xid 48 in the last 300000 ms (DCGM count)"),
        (2, "xid", 48, "Double Bit ECC Error"),
        (2, "xid", 63, "1 Xid 63 in the last 300000 ms (DCGM count)"),
    ]


def test_repeated_scrapes_report_changes_once():
    parser = DcgmParser()
    text = OLD.read_text()
    parser.parse(text, IDENTITY, ts_ns=1, monotonic=0.0)
    assert parser.parse(text, IDENTITY, ts_ns=2, monotonic=1.0)[1] == []
    changed = text.replace('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="2"', "X{").replace(
        'X{,UUID="GPU-a65c1b07', 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="2",UUID="GPU-a65c1b07')
    changed = changed.replace('"nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-07",'
                              'DCGM_FI_DRIVER_VERSION="550.127.05"} '
                              '1\nDCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="3"',
                              '"nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-07",'
                              'DCGM_FI_DRIVER_VERSION="550.127.05"} '
                              '3\nDCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="3"')
    assert changed != text
    events = parser.parse(changed, IDENTITY, ts_ns=3, monotonic=2.0)[1]
    assert [(e["gpu_index"], e["kind"]) for e in events] == [(2, "ecc_dbe")]
    assert "ecc_dbe_volatile 1 -> 3" in events[0]["message"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("9223372036854775792", None),
        ("9223372036854775807", None),
        ("9223372036854775791", 9223372036854775791),
        ("NaN", None),
    ],
)
def test_blank_sentinel_threshold(value, expected):
    text = (
        f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{gpu="0",UUID="GPU-1",pci_bus_id="00000000:18:00.0"}} '
        f"{value}\n"
    )
    samples, _ = DcgmParser().parse(text, IDENTITY)
    assert samples[0]["pcie_replay_count"] == expected


def test_uuid_label_of_the_old_namespace_and_no_host_label():
    text = 'dcgm_gpu_temp{gpu="0",uuid="GPU-77",pci_bus_id="0000:18:00.0"} 40\n' \
           'DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-78",pci_bus_id="00000000:2a:00.0"} 41\n'
    samples, _ = DcgmParser().parse(text, IDENTITY)
    assert [(s["gpu_uuid"], s["pci_bus_id"], s["node"], s["temp_c"]) for s in samples] == [
        ("GPU-78", "00000000:2A:00.0", "fallback-node", 41.0)]


def test_bad_lines_counted_and_the_rest_kept():
    text = (
        OLD.read_text().replace('DCGM_FI_DEV_GPU_TEMP{gpu="0"', 'DCGM_FI_DEV_GPU_TEMP{gpu="0')
        + 'garbage line here\nDCGM_FI_DEV_SM_CLOCK{gpu="9"} not-a-number\n'
    )
    parser = DcgmParser()
    samples, _ = parser.parse(text, IDENTITY)
    assert parser.stats.bad_lines == 3
    assert len(samples) == 4  # GPU 0 lost only its temperature line
    assert by_gpu(samples)[0].get("temp_c") is None and by_gpu(samples)[1]["temp_c"] == 57.0


_TOKENS = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_EXP_GPU_HEALTH_STATUS",
        "{",
        "}",
        "gpu=",
        '"0"',
        '"x"',
        ",",
        " ",
        "1",
        "-1",
        "1e400",
        "9223372036854775794",
        "NaN",
        "+Inf",
        "# TYPE ",
        "# HELP ",
        "counter",
        "gauge",
        "\\",
        '"',
        "err_code=",
        "xid=",
        "health_error_code=",
        "DCGM_FR_XID_ERROR",
        "\n",
        "=",
        "é",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), st.lists(_TOKENS, max_size=60).map("".join)))
def test_fuzz_parser_never_raises(text):
    parser = DcgmParser()
    samples, events = parser.parse(text, IDENTITY, ts_ns=1, monotonic=0.0)
    parser.parse(text, IDENTITY, ts_ns=2, monotonic=1.0)
    assert parser.stats.scrapes == 2
    assert parser.stats.bad_lines <= 2 * max(1, len(text.splitlines()))
    for row in samples:
        assert row["source"] == "dcgm"
    for event in events:
        assert event["kind"] and event["source"] == "dcgm"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.text(max_size=80).filter(lambda s: "\n" not in s and "\r" not in s), max_size=10)
)
def test_fuzz_garbage_lines_do_not_hide_good_ones(garbage):
    good = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",pci_bus_id="00000000:18:00.0"} 44\n'
    parser = DcgmParser()
    samples, _ = parser.parse("\n".join(garbage) + "\n" + good, IDENTITY)
    assert any(row.get("temp_c") == 44.0 and row["gpu_uuid"] == "GPU-1" for row in samples)


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self):
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter():
    handler = type("Handler", (_Handler,), {"body": NEW.read_bytes(), "status": 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


def test_source_over_http(exporter, caplog):
    server, handler = exporter
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    source = DcgmSource(NodeIdentity("node-a"), url, timeout_s=2.0)
    first = source.poll()
    assert first["gpu_samples"].num_rows == 4
    # the agent's node wins
    assert set(first["gpu_samples"].column("node").to_pylist()) == {"node-a"}
    assert "xid" in first["gpu_events"].column("kind").to_pylist()
    assert "gpu_events" not in source.poll()  # nothing new
    handler.status = 500
    assert source.poll() == {} and source.poll() == {}
    assert sum("HTTP 500" in r.getMessage() for r in caplog.records) == 1
    handler.status = 200
    assert source.poll()["gpu_samples"].num_rows == 4


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_cli_ingest_dcgm_url_then_query(exporter, store_dir):
    server, _ = exporter
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    result = _cli("ingest", "dcgm", url, "--store", str(store_dir))
    assert result.returncode == 0, result.stderr
    assert "4 GPU samples" in result.stdout
    store = Store(store_dir)
    assert store.query("SELECT count(*) AS n FROM gpu_samples WHERE node = 'gpu-node-07' AND "
                       "source = 'dcgm'"
                       ).to_pylist() == [{"n": 4}]
    assert (
        store.query(
            "SELECT count(*) AS n FROM gpu_events WHERE kind = 'xid' AND code = 48"
        ).to_pylist()[0]["n"]
        == 2
    )


@pytest.mark.parametrize(("location", "message"), [
    ("{tmp}/absent.prom", "absent.prom: cannot read"),
    ("{tmp}/empty.prom", "empty.prom: not a dcgm-exporter scrape: no DCGM_FI_* / DCGM_EXP_* GPU "
                         "metric"),
    ("{tmp}/garbage.prom", "garbage.prom: not a dcgm-exporter scrape: 2 bad line(s), first at line "
                           "1"),
    ("http://127.0.0.1:9/metrics", "dcgm http://127.0.0.1:9/metrics: cannot fetch"),
])
def test_cli_ingest_dcgm_bad_input(tmp_path, store_dir, location, message):
    (tmp_path / "empty.prom").write_text("# nothing here\n")
    (tmp_path / "garbage.prom").write_text("not a metric line\n{}\n")
    result = _cli(
        "ingest",
        "dcgm",
        location.format(tmp=tmp_path),
        "--store",
        str(store_dir),
        "--timeout",
        "2s",
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_read_scrape_raises_for_a_directory(tmp_path):
    with pytest.raises(DcgmFetchError, match="is a directory"):
        read_scrape(str(tmp_path), IDENTITY)
