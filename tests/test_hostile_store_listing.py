"""A store no file can hide (issue 37): every listing entry passes one guard (checked_segments)
before any engine sees it; a compacted segment replaces only what it holds; metadata is decoded
defensively; a newer writer's extra column is read; job ids are escaped reversibly in partition
names; a full disk is a one-line error naming the store. Real segments from the real sink, real
DuckDB queries through the CLI."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultlens.attribution.reading.maintenance import compact
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.layout import (
    REPLACES_KEY,
    StoreError,
    checked_segments,
    list_segments,
    resolve_store,
    safe_value,
    unescape_value,
)
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main
from tests.conftest import REPO_ROOT
from tests.test_hostile_store import GOOD_SAMPLES, GOOD_STEPS, _real_store

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _counts(store_dir: Path) -> dict[str, int]:
    with Store(store_dir) as store:
        return {
            table: store.query(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]
            for table in ("gpu_samples", "steps")
        }


def _cli_ok(store_dir: Path, capsys) -> str:
    """`tables` and a `sql` of each table succeed, no traceback; returns stderr."""
    assert main(["tables", "--store", str(store_dir), "--json"]) == 0
    for table in ("steps", "gpu_samples"):
        assert main(["sql", "--store", str(store_dir), f"SELECT count(*) FROM {table}"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _entry(kind: str, partition: Path, tmp_path: Path) -> Path:
    """A hostile listing entry named like a segment in the gpu_samples partition."""
    real = sorted(partition.glob("*.parquet"))[0]
    target = partition / f"99999999999999999999-{kind}.parquet"
    if kind == "dangling":
        target.symlink_to(partition / "no-such-file.parquet")
    elif kind == "link-out":
        outside = tmp_path / "outside.parquet"
        outside.write_bytes(real.read_bytes())  # a real segment, but not the store's
        target.symlink_to(outside)
    elif kind == "link-out-relative":
        outside = tmp_path / "outside2.parquet"
        outside.write_bytes(real.read_bytes())
        target.symlink_to(os.path.relpath(outside, partition))
    elif kind == "directory":
        target.mkdir()
        (target / "00000000000000000001-x.parquet").write_bytes(real.read_bytes())
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "link-to-dir":
        target.symlink_to(partition)
    elif kind == "link-to-proc":
        target.symlink_to("/proc/self/status")
    else:  # pragma: no cover
        raise ValueError(kind)
    return target


ENTRIES = [
    "dangling",
    "link-out",
    "link-out-relative",
    "directory",
    "fifo",
    "link-to-dir",
    "link-to-proc",
]


@pytest.mark.parametrize("kind", ENTRIES)
def test_no_listing_entry_reaches_an_engine_unchecked(store_dir, tmp_path, kind, capsys, caplog):
    partition = _real_store(store_dir)
    entry = _entry(kind, partition, tmp_path)
    with caplog.at_level(logging.WARNING):
        assert _counts(store_dir) == {"gpu_samples": GOOD_SAMPLES, "steps": GOOD_STEPS}
        _cli_ok(store_dir, capsys)
        assert str(entry) not in list_segments(resolve_store(store_dir), "gpu_samples")
        compact(store_dir)  # compaction neither reads nor deletes it
    assert os.path.lexists(entry)
    assert _counts(store_dir) == {"gpu_samples": GOOD_SAMPLES, "steps": GOOD_STEPS}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(entry) in w for w in warnings)


def test_a_symlinked_partition_directory_out_of_the_store_is_skipped(store_dir, tmp_path):
    partition = _real_store(store_dir)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    real = sorted(partition.glob("*.parquet"))[0]
    (outside / real.name.replace("0", "1", 1)).write_bytes(real.read_bytes())
    (partition.parent / "node=node-9").symlink_to(outside, target_is_directory=True)
    location = resolve_store(store_dir)
    listed = list_segments(location, "gpu_samples")
    assert all("node=node-9" not in path for path in listed)
    assert checked_segments(location, [f"{partition.parent}/node=node-9/x.parquet"]) == []
    assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES


def _compacted_beside(partition: Path, table: pa.Table | None, replaces: bytes) -> Path:
    target = partition / "c-99999999999999999999-forged.parquet"
    if table is None:
        table = pq.read_table(sorted(partition.glob("*.parquet"))[0]).slice(0, 0)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), REPLACES_KEY: replaces})
    pq.write_table(table, target)
    return target


def test_a_zero_row_compacted_segment_hides_nothing(store_dir, capsys):
    partition = _real_store(store_dir)
    names = ",".join(p.name for p in sorted(partition.glob("*.parquet")))
    _compacted_beside(partition, None, names.encode())
    assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES
    compact(store_dir)  # its leftovers pass never deletes what it does not hold
    assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES
    _cli_ok(store_dir, capsys)


def test_a_compacted_segment_holding_only_part_keeps_the_originals(store_dir):
    partition = _real_store(store_dir)
    originals = sorted(partition.glob("*.parquet"))
    part = pq.read_table(originals[0]).slice(0, 5)  # 5 of the first segment's rows
    _compacted_beside(partition, part, ",".join(p.name for p in originals).encode())
    # the originals are kept, and the forged file's 5 rows are read too (they are its rows)
    assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES + 5


def test_a_compacted_segment_with_corrupt_pages_hides_nothing(store_dir):
    partition = _real_store(store_dir)
    originals = sorted(partition.glob("*.parquet"))
    whole = pa.concat_tables([pq.read_table(p) for p in originals])
    forged = _compacted_beside(partition, whole, ",".join(p.name for p in originals).encode())
    data = bytearray(forged.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(4, len(data) - footer):
        data[i] = (data[i] * 7 + 13) % 256
    forged.write_bytes(bytes(data))
    assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES


def test_a_true_compacted_segment_beside_its_originals_counts_each_row_once(store_dir):
    partition = _real_store(store_dir)
    originals = sorted(partition.glob("*.parquet"))
    whole = pa.concat_tables([pq.read_table(p) for p in originals]).sort_by("ts")
    _compacted_beside(partition, whole, ",".join(p.name for p in originals).encode())
    assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES
    compact(store_dir)  # the leftovers pass deletes the originals it really holds
    assert sorted(p.name for p in partition.glob("*.parquet")) == [
        "c-99999999999999999999-forged.parquet"
    ]
    assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00bad", b"\xc3", b"../../steps/x.parquet,,"])
def test_undecodable_replaces_metadata_is_no_traceback(store_dir, capsys, raw):
    partition = _real_store(store_dir)
    _compacted_beside(partition, None, raw)
    assert _counts(store_dir) == {"gpu_samples": GOOD_SAMPLES, "steps": GOOD_STEPS}
    _cli_ok(store_dir, capsys)


def test_an_extra_column_is_read_by_name_and_an_unknown_version_warned(store_dir, caplog):
    partition = _real_store(store_dir)
    real = pq.read_table(sorted(partition.glob("*.parquet"))[0])
    newer = real.append_column("power_limit_w", pa.array([300.0] * real.num_rows))
    metadata = {**(newer.schema.metadata or {}), b"faultlens.schema_version": b"99"}
    pq.write_table(
        newer.replace_schema_metadata(metadata), partition / "00000000000000000001-new.parquet"
    )
    with caplog.at_level(logging.WARNING):
        counts = _counts(store_dir)
    assert counts["gpu_samples"] == GOOD_SAMPLES + real.num_rows
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "schema_version '99'" in text and "power_limit_w" in text


@pytest.mark.parametrize("ts", [2**62, -(2**62), 2**63 - 1])
def test_a_timestamp_no_datetime_holds_is_a_bad_segment_not_a_traceback(
    store_dir, capsys, caplog, ts
):
    partition = _real_store(store_dir)
    real = pq.read_table(sorted(partition.glob("*.parquet"))[0])
    index = real.schema.get_field_index("ts")
    huge = pa.array([ts] * real.num_rows, pa.int64()).cast(real.schema.field("ts").type)
    pq.write_table(real.set_column(index, "ts", huge), partition / "00000000000000000003-t.parquet")
    with caplog.at_level(logging.WARNING):
        assert _counts(store_dir)["gpu_samples"] == GOOD_SAMPLES
        assert "1 unreadable segment(s) skipped" in _cli_ok(store_dir, capsys)
    assert any("ts out of range" in r.getMessage() for r in caplog.records)


def _steps(job: str, n: int) -> list[dict]:
    return [
        {
            "ts": T0 + dt.timedelta(seconds=i),
            "node": "node-1",
            "job_id": job,
            "rank": 0,
            "step": i,
            "duration_s": 1.0,
        }
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "jobs",
    [("a/b", "a_b"), ("a b", "a_b", "a%20b"), ("x:y", "x/y", "x\\y", "x_y"), ("_", "", "_node")],
)
def test_job_ids_never_share_a_partition(store_dir, capsys, jobs):
    with SegmentSink(store_dir) as sink:
        for n, job in enumerate(jobs, start=1):
            sink.write("steps", _steps(job, n))
    names = {p.name for p in (store_dir / "steps").iterdir()}
    assert len(names) == len(jobs)
    assert {unescape_value(n[len("job=") :]) for n in names} == set(jobs)
    for n, job in enumerate(jobs, start=1):
        assert (
            main(
                [
                    "sql",
                    "--store",
                    str(store_dir),
                    "--job",
                    job,
                    "--json",
                    "SELECT count(*) AS n FROM steps",
                ]
            )
            == 0
        )
        assert f'"n": {n}' in capsys.readouterr().out


def test_a_job_id_too_long_for_a_path_is_a_one_line_error(store_dir, capsys):
    _real_store(store_dir)
    rc = main(["sql", "--store", str(store_dir), "--job", "j" * 10_000, "SELECT 1"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "at most 200" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(StoreError, match="at most 200"):
        safe_value("é" * 100)  # 100 characters, 600 once escaped


FILL = """
import datetime as dt, random, resource, signal, sys
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.store.layout import StoreError
if sys.argv[2] == "rlimit":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
rng = random.Random(7)
written = 0
sink = SegmentSink(sys.argv[1])
try:
    for flush in range(40):  # growing segments of one partition: ~60 KB, 120 KB, ...
        rows = [{"ts": T0 + dt.timedelta(seconds=flush * 10**6 + i), "node": "node-1",
                 "job_id": "job-1", "rank": rng.randrange(4096), "step": flush,
                 "duration_s": rng.random()} for i in range(5000 * (flush + 1))]
        sink.write("steps", rows)
        written += sum(r.rows for r in sink.flush("steps"))
except StoreError as exc:
    print(written)
    print(exc, file=sys.stderr)
    sys.exit(3)
"""


def _fill(store: Path, how: str) -> tuple[int, int, str]:
    done = subprocess.run(
        [sys.executable, "-c", FILL, str(store), how],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    return done.returncode, int(done.stdout.strip() or -1), done.stderr


@pytest.mark.parametrize("how", ["rlimit", "tmpfs"])
def test_a_full_disk_is_a_one_line_error_naming_the_store(tmp_path, how):
    store = tmp_path / "store"
    mounted = False
    if how == "tmpfs":
        store.mkdir()
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(store)],
            capture_output=True,
            check=False,
        )
        if mount.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted = True
    try:
        rc, written, err = _fill(store, how)
        assert rc == 3, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert f"store {str(store)!r}" in err
        expected = "No space left on device" if how == "tmpfs" else "File too large"
        assert expected in err
        # every row a flush reported written is there, once
        with Store(store) as reader:
            assert reader.query("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"] == written
        assert written > 0
    finally:
        if mounted:
            subprocess.run(["umount", str(store)], check=False)
