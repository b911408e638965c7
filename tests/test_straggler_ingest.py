"""`faultlens ingest steps FILE`: per-rank timing tables users already have -> steps and ranks, then
straggler analysis offline; bad files get one line naming the column and exit 2.

The good input is the raw timer log a real torch pipeline job exported
(tests/torch_jobs/train_pipeline.py: one row per section instance, so per microbatch, with the
user's own column names and a separate placement table)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import IncidentClass
from faultlens.collectors.artifacts.step_table import StepTableError, read_step_table
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from tests.torch_jobs.straggler_jobs import straggler_artifacts

MAPPING = [
    "--map",
    "rank=global_rank",
    "--map",
    "step=iteration",
    "--map",
    "section=timer",
    "--map",
    "start=start_ns",
    "--map",
    "duration=elapsed_ms",
    "--duration-unit",
    "ms",
    "--start-unit",
    "ns",
    "--placement-map",
    "rank=global_rank",
    "--placement-map",
    "node=host",
    "--placement-map",
    "dp_rank=data_parallel_rank",
    "--placement-map",
    "pp_rank=pipeline_rank",
]


@pytest.fixture(scope="module")
def jobs() -> dict[str, Path]:
    return straggler_artifacts()


def faultlens(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_table(art: Path, out: Path, suffix: str) -> Path:
    frame = pd.concat([pd.read_csv(p) for p in sorted((art / "timings").glob("rank_*.csv"))])
    path = out / f"timers{suffix}"
    if suffix == ".parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_an_exported_timer_log_finds_the_slow_worker_offline(jobs: dict[str, Path], tmp_path: Path,
                                                             suffix: str) -> None:
    art = jobs["worker_2x4"]
    meta = json.loads((art / "meta.json").read_text())
    table = _one_table(art, tmp_path, suffix)
    store = tmp_path / "store"

    done = faultlens("ingest", "steps", str(table), "--store", str(store), "--job", "offline-1",
                     "--placement", str(art / "timings" / "placement.csv"), *MAPPING)

    assert done.returncode == 0, done.stderr
    assert f"{meta['steps'] * 8} steps rows" in done.stdout
    found = [i for i in attribute(str(store), engine=Engine(catalog=load_xid_catalog()))
             if i.incident_class is IncidentClass.STRAGGLER]
    (incident,) = found
    assert list(incident.culprit_ranks) == meta["expected"]["ranks"]
    assert incident.culprit_nodes == (f"node-{meta['expected']['ranks'][0] // 2}",)
    # the placement's dp/pp ranks were used
    assert "pairwise, 2 replicas" in incident.evidence[0].text


def test_microbatch_rows_of_one_section_add_up(jobs: dict[str, Path], tmp_path: Path) -> None:
    art = jobs["worker_2x4"]
    table = _one_table(art, tmp_path, ".csv")
    tables = read_step_table(
        table,
        mapping={
            "rank": "global_rank",
            "step": "iteration",
            "section": "timer",
            "start": "start_ns",
            "duration": "elapsed_ms",
        },
        duration_unit="ms",
        start_unit="ns",
    )
    raw = pd.read_csv(table)
    expect = raw[(raw.global_rank == 0) & (raw.iteration == 5) & (raw.timer == "forward-compute")]
    assert len(expect) == json.loads((art / "meta.json").read_text())["microbatches"]
    rows = tables.steps.to_pylist()
    row = next(r for r in rows if r["rank"] == 0 and r["step"] == 5)
    assert dict(row["sections"])["forward-compute"] == pytest.approx(expect.elapsed_ms.sum() / 1000)


@pytest.mark.parametrize(
    "edit,args,message",
    [
        (
            lambda f: f.drop(columns=["elapsed_ms"]),
            [],
            "column 'duration' (mapped from 'elapsed_ms') not found",
        ),
        (
            lambda f: f.assign(iteration=f.iteration.astype(str).where(f.index != 3, "x")),
            [],
            "column 'step': expected",
        ),
        (
            lambda f: f.assign(elapsed_ms=-f.elapsed_ms),
            [],
            "column 'duration': expected seconds >= 0",
        ),
        (lambda f: f.assign(start_ns="yesterday"), [], "column 'start': expected timestamps"),
        (lambda f: f, ["--map", "rank=nope"], "column 'rank' (mapped from 'nope') not found"),
    ],
)
def test_bad_files_get_one_line_naming_the_column_and_exit_2(tmp_path: Path, edit, args: list[str],
                                                             message: str) -> None:
    frame = pd.DataFrame({"global_rank": [0, 0, 1, 1], "iteration": [0, 0, 0, 0],
                          "timer": ["forward-compute", "backward-compute"] * 2,
                          "start_ns": [1_700_000_000_000_000_000 + i for i in range(4)],
                          "elapsed_ms": [10.0, 20.0, 11.0, 19.0]})
    path = tmp_path / "bad.csv"
    edit(frame).to_csv(path, index=False)

    done = faultlens(
        "ingest", "steps", str(path), "--store", str(tmp_path / "store"), *MAPPING[:10], *args
    )

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(path) in lines[0], done.stderr


def test_unknown_format_and_missing_file_are_errors(tmp_path: Path) -> None:
    with pytest.raises(StepTableError, match="unknown format"):
        read_step_table(tmp_path / "timers.json")
    with pytest.raises(StepTableError, match="no such file"):
        read_step_table(tmp_path / "timers.csv")
