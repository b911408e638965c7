"""Kernel-log files for a one-shot import (`faultlens ingest kmsg`, issue 37): a large log, one
line of tens of MB, NUL blocks (what a crash leaves in syslog), bytes that are not UTF-8, binary
garbage, a file beyond the size limit, an Xid storm beyond the event limit, a FIFO. The file is
read as a stream: every good line of the real kern.log around the hostile part is still parsed,
and what was skipped is a counted note naming the file. The files are generated here; the RSS and
CPU of the big ones (GBs) are measured by bench/bench_kmsg_read.py, not here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultlens.collectors.sources.kmsg import KernelLogFileError, read_kernel_log
from faultlens.collectors.sources.source import NodeIdentity
from tests.conftest import DATA_DIR

REPO = Path(__file__).resolve().parents[1]
REAL = (DATA_DIR / "gpu" / "node-kern.log").read_bytes()
NODE = NodeIdentity("n")


def _events(rows: list[dict]) -> list[tuple]:
    return sorted((r["kind"], r["code"], r["pci_bus_id"], r["raw"]) for r in rows)


@pytest.fixture(scope="module")
def real_events(tmp_path_factory) -> list[tuple]:
    path = tmp_path_factory.mktemp("real") / "kern.log"
    path.write_bytes(REAL)
    result = read_kernel_log(path, NODE)
    assert result.rows and not result.notes
    return _events(result.rows)


def _write(path: Path, *parts: bytes) -> Path:
    with open(path, "wb") as file:
        for part in parts:
            file.write(part)
    return path


def _one_line(notes: tuple[str, ...], path: Path, *words: str) -> str:
    note = next((n for n in notes if all(w in n for w in words)), None)
    assert note is not None, notes
    assert "\n" not in note and str(path) in note
    return note


@pytest.mark.parametrize("size_mb", [3, 40])
def test_one_huge_line_is_skipped_as_it_is_read(tmp_path: Path, real_events, size_mb: int) -> None:
    """A line of tens of MB (no newline for MBs) between two copies of the real log: both copies
    are parsed, the line is one bad line and one note."""
    huge = b"x" * (size_mb << 20)
    path = _write(tmp_path / "kern.log", REAL, b"NVRM: Xid " + huge + b"\n", REAL)
    result = read_kernel_log(path, NODE)
    assert _events(result.rows) == sorted(real_events * 2)
    assert result.stats.bad_lines == 1
    _one_line(result.notes, path, "1 line(s) longer than 65536 bytes")


def test_a_huge_last_line_without_a_newline(tmp_path: Path, real_events) -> None:
    path = _write(tmp_path / "kern.log", REAL, b"y" * (5 << 20))
    result = read_kernel_log(path, NODE)
    assert _events(result.rows) == real_events
    _one_line(result.notes, path, "longer than")


@pytest.mark.parametrize("block", [b"\x00" * (1 << 20), os.urandom(1 << 20),
                                   b"\xff\xfe\xc0\x80 NVRM: Xid \xed\xa0\x80\n" * 20_000],
                         ids=["nul-block", "random-bytes", "not-utf8-lines"])
def test_garbage_between_good_lines_is_counted_and_the_good_lines_read(
    tmp_path: Path, real_events, block: bytes
) -> None:
    path = _write(tmp_path / "syslog", REAL, block, b"\n", REAL)
    result = read_kernel_log(path, NODE)
    assert _events(result.rows) == sorted(real_events * 2)
    assert any(word in note for note in result.notes
               for word in ("NUL bytes", "not valid UTF-8", "longer than")), result.notes
    for note in result.notes:
        assert str(path) in note and "\n" not in note


def test_a_binary_file_is_one_line_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "core", b"\x7fELF\x02\x01\x01\x00" + os.urandom(200_000))
    with pytest.raises(KernelLogFileError, match=r"core: binary data"):
        read_kernel_log(path, NODE)


def test_a_file_beyond_max_bytes_is_read_from_its_newest_lines(tmp_path: Path,
                                                               real_events) -> None:
    filler = b"Nov 30 11:00:00 gpu-node-07 kernel: usb 1-1: new device\n" * 40_000
    path = _write(tmp_path / "kern.log", REAL, filler, REAL)
    result = read_kernel_log(path, NODE, max_bytes=len(filler) // 2 + len(REAL))
    assert _events(result.rows) == real_events  # the newest copy only
    _one_line(result.notes, path, "read only the last", "skipped")


def test_an_xid_storm_beyond_max_events_is_cut_with_a_note(tmp_path: Path) -> None:
    storm = b"".join(
        b"Nov 30 11:00:%02d gpu-node-07 kernel: NVRM: Xid (PCI:0000:2b:00): 13, pid=%d, "
        b"Graphics Exception\n" % (i % 60, 1000 + i) for i in range(3000))
    path = _write(tmp_path / "kern.log", storm)
    result = read_kernel_log(path, NODE, max_events=1000)
    assert len(result.rows) == 1000
    _one_line(result.notes, path, "2000 GPU event(s) beyond the first 1000")


def test_a_fifo_is_refused_unopened(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    with pytest.raises(KernelLogFileError, match="not a regular file"):
        read_kernel_log(fifo, NODE)


def test_the_cli_prints_each_note_as_one_warning_and_stores_the_good_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "kern.log", REAL, b"z" * (2 << 20) + b"\n", b"\x00" * 4096 + b"\n",
                  REAL)
    proc = subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", "ingest", "kmsg", str(path),
         "--store", str(tmp_path / "store"), "--utc"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert any("longer than 65536" in w for w in warnings), proc.stderr
    assert any("NUL bytes" in w for w in warnings), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "GPU events" in proc.stdout


def test_the_agent_source_never_holds_a_huge_line(tmp_path: Path, real_events) -> None:
    """The node agent follows a log file; a line of tens of MB arriving over several polls grew
    its buffer with it. Now the buffer stays under the longest line parsed, the line is one bad
    line, and the real lines before and after it are read."""
    from faultlens.collectors.sources.kmsg import KmsgSource

    path = _write(tmp_path / "kern.log", REAL)
    source = KmsgSource(NODE, path, from_start=True, boot_time=0)
    rows = []

    def poll() -> None:
        batch = source.poll().get("gpu_events")
        if batch is not None:
            rows.extend(batch.to_pylist())
        assert len(source._partial) <= 64 * 1024

    poll()
    with open(path, "ab") as file:
        for _ in range(3):  # 24 MiB without a newline, over three polls
            file.write(b"w" * (8 << 20))
            file.flush()
            poll()
        file.write(b"\n" + REAL)
    poll()
    poll()
    assert _events(rows) == sorted(real_events * 2)
    assert source.parser.stats.bad_lines == 1
    source.close()


def test_the_fuzz_seed_set_finds_no_crash_lost_line_or_silent_skip() -> None:
    """The CI's seed run of bench/bench_kmsg_read_fuzz.py (the bench runs 20,000 inputs)."""
    from bench.bench_kmsg_read_fuzz import run

    result = run(150, 1)
    assert result["read"] + result["refused"] == 150
    assert (result["crashes"], result["lost_lines"], result["silent_skips"]) == (0, 0, 0), result
