"""Spark reads the store as it is (docs/scale-out.md): pyspark in local mode over a small demo-like
store (the simulator's cluster, then `faultlens attribute` and `faultlens decide`, a real StepTimer
with its heartbeat read by the HeartbeatSource), every table's row count and time range equal to
DuckDB's over the same files, and the table definitions the docs show. Skipped only where pyspark
(the `spark` extra) or a Java runtime is missing."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.schema import TABLE_NAMES, schema_for

TS_COLUMNS = {
    t: [f.name for f in schema_for(t) if pa.types.is_timestamp(f.type)] for t in TABLE_NAMES
}


@pytest.fixture(scope="module")
def demo_like_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every table of the store written by its real producers (a few seconds)."""
    from faultlens.collectors.store.sink import SegmentSink
    from faultlens.collectors.training.heartbeat import HeartbeatSource
    from faultlens.collectors.training.numerics import NumericsProbe
    from faultlens.collectors.training.step_timer import RankIdentity, StepTimer
    from faultlens.controller.cli.main import main as cli
    from faultlens.controller.lab.simulate import SimConfig, simulate
    from faultlens.controller.slurm.nodecheck import NodeCheck, Verdict

    root = tmp_path_factory.mktemp("spark-store")
    store = root / "store"
    simulate(
        SimConfig(
            seed=5,
            nodes=2,
            gpus_per_node=4,
            hours=1.0,
            faults_per_day=200.0,
            stragglers_per_day=0.0,
            benign_per_day=100.0,
            step_seconds=8.0,
            checkpoint_every_steps=20,
            fault_sequence=("gpu_xid79", "nccl_stuck_rank", "software_bug"),
        ),
        str(store),
    )
    assert cli(["attribute", "--store", str(store), "--json"]) == 0
    assert cli(["decide", "--store", str(store), "--json"]) == 0
    beats = root / "heartbeats"
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "TORCHELASTIC_RUN_ID": "timer-job", "FAULTLENS_NODE": "node-t"}
    with SegmentSink(str(store)) as sink:
        timer = StepTimer(
            sink, identity=RankIdentity.from_env(env), heartbeat_dir=beats, flush_interval_s=60
        )
        probe = NumericsProbe(timer)
        for n in range(3):
            with timer.step(n, tokens=128) as step, timer.section("forward"):
                step.loss = 1.0 / (n + 1)
            probe.record(n, loss=step.loss)
        timer.close()
        batches = HeartbeatSource(beats).poll()
        assert batches, "the step timer left no heartbeat"
        for table, batch in batches.items():
            sink.write(table, batch)
        # a node check's row, as `faultlens node-check` records it
        checked = dt.datetime.now(dt.UTC)
        check = NodeCheck("node-t", Verdict.PASS, "resumed", checked - dt.timedelta(hours=1), 0,
                          "", None, "faultlens node-check: clean")
        sink.write("node_checks", [check.to_row(checked)])
    return store


def _duckdb_ranges(store: Path) -> dict[str, tuple]:
    out = {}
    with Store(str(store)) as opened:
        for table in TABLE_NAMES:
            parts = ", ".join(
                f'epoch_ns(min("{c}")) // 1000, epoch_ns(max("{c}")) // 1000'
                for c in TS_COLUMNS[table]
            )
            out[table] = tuple(
                opened.query(f'SELECT count(*), {parts} FROM "{table}"').to_pylist()[0].values()
            )
    return out


def test_every_table_is_written_in_microseconds(demo_like_store: Path) -> None:
    """Every producer of the fixture (simulator, engine, policy, step timer, numerics probe,
    heartbeats) wrote us
    timestamps.
    """
    seen = set()
    for path in demo_like_store.rglob("*.parquet"):
        table = path.relative_to(demo_like_store).parts[0]
        seen.add(table)
        schema = pq.read_schema(path)
        for name in TS_COLUMNS[table]:
            if schema.get_field_index(name) >= 0:
                assert schema.field(name).type == pa.timestamp("us", tz="UTC"), (path, name)
        ts = pq.ParquetFile(path).schema.column(0)  # identity columns first: ts
        assert ts.name == "ts" and "microseconds" in str(ts.logical_type), (path, ts.logical_type)
    assert seen == set(TABLE_NAMES), sorted(set(TABLE_NAMES) - seen)


def _spark_available() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install '.[spark]')"
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and Path(java_home, "bin", "java").exists()):
        return "no Java runtime (java is not on PATH and JAVA_HOME is unset)"
    return None


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory):
    missing = _spark_available()
    if missing:
        pytest.skip(missing)
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (SparkSession.builder.master("local[1]").appName("faultlens-test")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "1").config("spark.default.parallelism", "1")
               .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "512m")
               .config("spark.sql.warehouse.dir", str(warehouse))
               .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={warehouse}")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_spark_reads_every_table_as_duckdb_does(spark, demo_like_store: Path) -> None:
    """spark.read.parquet over each table directory: same rows and time range (microseconds) as
    DuckDB. The store as it was (TIMESTAMP(NANOS)) failed here: [PARQUET_TYPE_ILLEGAL] Illegal
    Parquet type: INT64 (TIMESTAMP(NANOS, true))."""
    got = {}
    for table in TABLE_NAMES:
        frame = spark.read.parquet(str(demo_like_store / table))
        assert {"job", "date", "node"} <= set(frame.columns), table  # partition discovery
        parts = ", ".join(
            f"unix_micros(min(`{c}`)), unix_micros(max(`{c}`))" for c in TS_COLUMNS[table]
        )
        got[table] = tuple(frame.selectExpr(*f"count(*), {parts}".split(", ")).collect()[0])
    expected = _duckdb_ranges(demo_like_store)
    for table in TABLE_NAMES:
        assert got[table] == expected[table], table
        assert expected[table][0] > 0, table


def test_spark_table_definitions_of_the_docs(spark, demo_like_store: Path) -> None:
    """The two definitions docs/scale-out.md shows: CREATE TABLE ... USING parquet with partitions
    discovered, and one with its columns and partitions declared (then MSCK REPAIR TABLE)."""
    expected = _duckdb_ranges(demo_like_store)
    spark.sql(f"CREATE TABLE steps USING parquet LOCATION '{demo_like_store / 'steps'}'")
    got = spark.sql(
        "SELECT count(*), unix_micros(min(ts)), unix_micros(max(ts)) FROM steps"
    ).collect()[0]
    assert tuple(got) == expected["steps"][:3]
    with Store(str(demo_like_store)) as opened:
        per_node = opened.query(
            "SELECT node, count(*) AS n FROM steps GROUP BY node ORDER BY node"
        ).to_pylist()
        xids = opened.query("SELECT node, code, count(*) AS n FROM gpu_events WHERE kind = 'xid' "
                            "GROUP BY node, code ORDER BY node, code").to_pylist()
    # the node= partition value and the node data column agree (Spark reads the partition's)
    got = spark.sql("SELECT node, count(*) AS n FROM steps GROUP BY node ORDER BY node").collect()
    assert [row.asDict() for row in got] == per_node
    spark.sql(f"""
        CREATE TABLE gpu_events (
            ts TIMESTAMP, cluster STRING, job_id STRING, attempt INT, `rank` INT, local_rank INT,
            gpu_index INT, gpu_uuid STRING, pci_bus_id STRING, source STRING, kind STRING, code INT,
            message STRING, pid BIGINT, process_name STRING, raw STRING, job STRING, date STRING,
            node STRING)
        USING parquet PARTITIONED BY (job, date, node)
        LOCATION '{demo_like_store / 'gpu_events'}'""")
    spark.sql("MSCK REPAIR TABLE gpu_events")
    got = spark.sql("SELECT node, code, count(*) AS n FROM gpu_events WHERE kind = 'xid' AND date "
                    ">= '2026-01-01' "
                    "GROUP BY node, code ORDER BY node, code").collect()
    assert xids and [row.asDict() for row in got] == xids
