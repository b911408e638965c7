"""At 80 columns (a pipe, a log file) the strings users copy are never folded: job ids, incident
and decision ids, nodes, timestamps and numbers stay whole on one line; other columns are cut or
left out first (with a note), and a table is a table where one fits (goodput's attempts)."""

from __future__ import annotations

import datetime as dt
import io
import re

import pytest

from faultlens.controller.cli.main import main
from faultlens.controller.report.render import render_table

SUMMARY = (
    "crash: rank 2 on node-3 killed by SIGKILL at step 37; cause unknown "
    "(crash-killed-by-signal); the process wrote no dump and no error file"
)


def _rows(job: str, n: int = 3) -> list[dict]:
    t0 = dt.datetime(2026, 12, 7, 14, 51, 55, 333822, tzinfo=dt.UTC)
    return [
        {
            "incident_id": f"inc-{i:016x}",
            "job_id": job,
            "ts": t0 + dt.timedelta(seconds=i),
            "node": f"gpu-node-{i:03d}.cluster.example",
            "confidence": 0.8 + i / 100,
            "summary": SUMMARY,
        }
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "job",
    [
        "j",
        "demo-20261207-145058",
        "pretrain-llama-70b-run-0003",
        "user-ddp_dataloader-slow-1796656629",
    ],
)
@pytest.mark.parametrize("width", [60, 80, 100])
def test_identifiers_and_times_stay_whole(job, width):
    rows = _rows(job)
    out = io.StringIO()
    render_table(rows, out=out, width=width)
    text = out.getvalue()
    lines = text.splitlines()
    for row in rows:
        for value in (row["incident_id"], row["job_id"], row["node"], row["ts"].isoformat(sep=" ")):
            assert any(value in line for line in lines), (value, text)
    if "-[ 1 ]" not in text:  # a table: it fits
        assert max(len(line) for line in lines) <= width


def test_optional_columns_go_before_a_table_turns_into_records():
    rows = [
        {
            "decision_id": f"dec-{i:016x}",
            "incident_id": f"inc-{i:016x}",
            "job_id": "demo-20261207-145058",
            "action": "failover",
            "cause": "thermal",
            "exclude_nodes": ["node-1"],
            "restore": "local+durable step 30",
            "status": "applied",
            "hooks": {"slurm": "delivered"},
        }
        for i in range(3)
    ]
    out = io.StringIO()
    render_table(
        rows, out=out, width=80, optional=("hooks", "restore", "exclude_nodes", "cause", "job_id")
    )
    text = out.getvalue()
    assert "-[ 1 ]" not in text and "left out to fit 80 columns" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for row in rows:
        assert re.search(rf"│ {row['decision_id']} +│ {row['incident_id']} +│", text)


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("widths") / "store"
    assert (
        main(
            [
                "simulate",
                "--store",
                str(store),
                "--nodes",
                "2",
                "--gpus-per-node",
                "2",
                "--hours",
                "0.5",
                "--faults-per-day",
                "200",
                "--seed",
                "0",
                "--json",
            ]
        )
        == 0
    )
    assert main(["attribute", "--store", str(store), "--json"]) == 0
    assert main(["decide", "--store", str(store), "--json"]) == 0
    return store


def test_commands_at_80_columns_keep_ids_whole(sim_store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    assert main(["goodput", "--store", str(sim_store), "--job", "pretrain-0"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"┃ attempt ┃ steps +┃", out), out  # the attempts as a table
    assert "-[ 1 ]" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    for command in (["jobs"], ["decisions"], ["incidents"]):
        assert main([*command, "--store", str(sim_store)]) == 0
        out = capsys.readouterr().out
        assert max(len(line) for line in out.splitlines()) <= 80, out
        for found in re.findall(r"(?:inc|dec)-[0-9a-f]{6,}", out):
            assert len(found) == len("inc-") + 16, (found, out)  # never cut inside
        if command != ["decisions"]:  # which leaves job_id out at 80 columns, ids first
            assert "pretrain-0" in out
