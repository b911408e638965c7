"""One broken segment never hides the rest of the store (issue 16): 0-byte, truncated, corrupt,
wrong-schema and wrong-type segments beside real ones written by the real sink; `faultlens doctor`
lists and quarantines them; compaction leaves them out and cleans the temporary files of SIGKILLed
writers; an unreachable store is an error."""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultlens.attribution.reading.maintenance import compact
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.layout import StoreError
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main
from tests.conftest import REPO_ROOT

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
GOOD_SAMPLES = 40
GOOD_STEPS = 30


def _real_store(store_dir):
    """Real segments: gpu_samples of node-1 in two flushes, steps of node-1 (the sink's own layout).
    """
    with SegmentSink(store_dir) as sink:
        for half in range(2):
            sink.write(
                "gpu_samples",
                [
                    {
                        "ts": T0 + dt.timedelta(seconds=half * 100 + i),
                        "node": "node-1",
                        "gpu_index": i % 8,
                        "source": "nvml",
                        "temp_c": 50.0 + i,
                        "sm_clock_mhz": 1980,
                    }
                    for i in range(GOOD_SAMPLES // 2)
                ],
            )
            sink.flush()
        sink.write(
            "steps",
            [
                {
                    "ts": T0 + dt.timedelta(seconds=i),
                    "node": "node-1",
                    "job_id": "job-1",
                    "rank": 0,
                    "step": i,
                    "duration_s": 1.0,
                }
                for i in range(GOOD_STEPS)
            ],
        )
    (partition,) = {path.parent for path in (store_dir / "gpu_samples").rglob("*.parquet")}
    return partition


def _break(kind: str, partition, store_dir) -> str:
    """Put one broken segment of `kind` into the gpu_samples partition; returns its path."""
    real = sorted(partition.glob("*.parquet"))[0]
    target = partition / f"99999999999999999999-bad{kind.replace('_', '')}.parquet"
    data = real.read_bytes()
    if kind == "zero_bytes":
        target.write_bytes(b"")
    elif kind == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif kind == "not_parquet":
        target.write_bytes(b"PAR1" + b"\x00" * 200)
    elif kind == "corrupt_pages":  # footer intact, data pages garbage
        middle = bytearray(data)
        footer = int.from_bytes(data[-8:-4], "little") + 8
        for i in range(4, len(data) - footer):
            middle[i] = (middle[i] * 7 + 13) % 256
        target.write_bytes(bytes(middle))
    # a steps segment in the gpu_samples directory: phantom all-null rows before
    elif kind == "wrong_table":
        shutil.copy(next((store_dir / "steps").rglob("*.parquet")), target)
    elif kind == "wrong_types":  # temp_c as text: crashed attribute in pandas before
        table = pa.table({"ts": pa.array([T0], pa.timestamp("ns", tz="UTC")), "node": ["node-1"],
                          "temp_c": ["hot"], "sm_clock_mhz": ["fast"]})
        pq.write_table(table, target)
    elif kind == "no_ts":
        pq.write_table(
            pa.table({"node": ["node-1"], "temp_c": pa.array([1.0], pa.float32())}), target
        )
    else:  # pragma: no cover
        raise ValueError(kind)
    return str(target)


KINDS = [
    "zero_bytes",
    "truncated",
    "not_parquet",
    "corrupt_pages",
    "wrong_table",
    "wrong_types",
    "no_ts",
]


@pytest.mark.parametrize("kind", KINDS)
def test_one_bad_segment_is_skipped_with_one_warning_and_everything_else_reads(
    store_dir, kind, caplog
):
    partition = _real_store(store_dir)
    bad = _break(kind, partition, store_dir)
    with caplog.at_level(logging.WARNING, logger="faultlens.store"), Store(store_dir) as store:
        assert store.query("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": GOOD_STEPS}]
        assert store.query("SELECT count(*) AS n FROM gpu_samples").to_pylist() == [
            {"n": GOOD_SAMPLES}
        ]
        # no phantom rows, the columns keep their types
        frame = store.read_table("gpu_samples").to_pandas()
        assert frame["temp_c"].dtype.kind == "f" and frame["node"].notna().all()
        assert (
            store.query("SELECT count(*) AS n FROM gpu_samples WHERE temp_c > 0").to_pylist()[0][
                "n"
            ]
            == 40
        )
        summary = {s.table: s for s in store.summary()}
        assert summary["gpu_samples"].bad_segments == 1 and summary["steps"].bad_segments == 0
        assert [b.path for b in store.bad_segments()] == [bad]
        store.refresh()  # a later listing does not warn again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad in warnings[0]


def test_several_bad_segments_in_several_tables(store_dir, capsys):
    partition = _real_store(store_dir)
    bad = [
        _break(kind, partition, store_dir)
        for kind in ("zero_bytes", "wrong_table", "corrupt_pages")
    ]
    steps_dir = next((store_dir / "steps").rglob("*.parquet")).parent
    (steps_dir / "00000000000000000001-trunc.parquet").write_bytes(b"PAR1\x15\x04")
    assert (
        main(["sql", "--store", str(store_dir), "SELECT count(*) AS n FROM steps", "--json"]) == 0
    )
    assert '"n": 30' in capsys.readouterr().out
    assert main(["tables", "--store", str(store_dir), "--json"]) == 0
    captured = capsys.readouterr()
    assert '"bad_segments": 3' in captured.out and '"bad_segments": 1' in captured.out
    assert "4 unreadable segment(s) skipped" in captured.err
    # doctor lists them and exits 1; --quarantine moves them aside (nothing deleted) and exits 0
    assert main(["doctor", "--store", str(store_dir), "--json"]) == 1
    listed = capsys.readouterr().out
    assert all(path in listed for path in bad)
    assert main(["doctor", "--store", str(store_dir), "--quarantine", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("quarantined ->") == 4
    assert len(list((store_dir / "_quarantine").rglob("*.parquet"))) == 4
    assert main(["doctor", "--store", str(store_dir)]) == 0
    assert "no problems found" in capsys.readouterr().err
    with Store(store_dir) as store:
        assert store.bad_segments() == []
        assert store.query("SELECT count(*) AS n FROM gpu_samples").to_pylist() == [
            {"n": GOOD_SAMPLES}
        ]


def test_doctor_finds_corrupt_data_behind_a_good_footer_unless_quick(store_dir, capsys):
    partition = _real_store(store_dir)
    bad = _break("corrupt_pages", partition, store_dir)
    assert main(["doctor", "--store", str(store_dir), "--quick", "--json"]) == 0
    assert bad not in capsys.readouterr().out
    assert main(["doctor", "--store", str(store_dir), "--json"]) == 1
    assert bad in capsys.readouterr().out


def test_attribute_runs_over_a_store_with_bad_segments(store_dir, capsys):
    partition = _real_store(store_dir)
    for kind in ("wrong_types", "truncated"):
        _break(kind, partition, store_dir)
    assert main(["attribute", "--store", str(store_dir), "--dry-run"]) == 0
    assert main(["incidents", "--store", str(store_dir)]) == 0


def test_compaction_leaves_bad_segments_out_and_cleans_dead_writers_temp_files(store_dir, caplog):
    partition = _real_store(store_dir)
    bad = _break("truncated", partition, store_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # writers that die half-way through a segment: forked children SIGKILL themselves after writing
    # part of it
    script = ("import os, sys\nfrom faultlens.collectors.store.layout import temp_name\nfor n in "
              "range(5):\n"
              "    pid = os.fork()\n    if pid == 0:\n"
              "        open(os.path.join(sys.argv[1], temp_name(f'{n:020d}-x.parquet')), "
              "'wb').write(b'PAR1 half')\n"
              "        os.kill(os.getpid(), 9)\n    os.waitpid(pid, 0)\n")
    subprocess.run(
        [sys.executable, "-c", script, str(partition)],
        env=env,
        timeout=60,
        cwd=REPO_ROOT,
        check=True,
    )
    # the real sink SIGKILLed at random moments while writing (the 60-kill probe of the issue,
    # shortened)
    rng = random.Random(16)
    for trial in range(2):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sink_writer", str(store_dir), str(trial), "job-k"],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    # another host's live writer: kept
    own = partition / f".{'0' * 20}-live.parquet.{os.getpid()}@{'x'}.tmp"
    own.write_bytes(b"PAR1")
    # older name form, pid past pid_max
    legacy_dead = partition / ".00000000000000000002-y.parquet.4194304.tmp"
    legacy_dead.write_bytes(b"PAR1")
    dead_temps = [p for p in store_dir.rglob(".*.tmp") if p not in (own,)]
    assert len(dead_temps) >= 6
    with caplog.at_level(logging.WARNING, logger="faultlens.maintenance"):
        compact(str(store_dir))
    assert [p for p in store_dir.rglob(".*.tmp")] == [own]
    assert os.path.exists(bad) and any(bad in r.getMessage() for r in caplog.records)
    with Store(store_dir) as store:
        assert store.query("SELECT count(*) AS n FROM gpu_samples").to_pylist() == [
            {"n": GOOD_SAMPLES}
        ]
        assert len([p for p in store.segments("gpu_samples") if p.endswith(".parquet")]) == 1


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/store", "http://127.0.0.1:9/faultlens"])
def test_an_unreachable_store_is_an_error_not_an_empty_store(url, capsys):
    with pytest.raises(StoreError, match="cannot reach"):
        Store(url)
    assert main(["tables", "--store", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach" in err[0] and url in err[0]
    assert main(["doctor", "--store", url]) == 2
