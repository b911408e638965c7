"""The decision CLI: decide, decisions, deliver, checkpoints (in-process through
faultlens.controller.cli.main).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.policy import DEFAULT_POLICY_PATH
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.checkpoints.manifest import Manifest, shard_entries
from faultlens.controller.cli.main import main

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _checkpoint(directory: Path, step: int, ranks: range, world_size: int) -> None:
    directory.mkdir(parents=True)
    files = {r: (f"rank_{r}.pt", f"{r}@{step}".encode()) for r in ranks}
    for name, data in files.values():
        (directory / name).write_bytes(data)
    (directory / "manifest.json").write_bytes(
        Manifest(step, world_size, shard_entries(files)).to_json()
    )


@pytest.fixture
def setup(tmp_path: Path, store_dir: Path) -> dict:
    incidents = [
        Incident(
            "inc-hw",
            IncidentClass.CRASH,
            Cause.GPU_HARDWARE,
            T0,
            T0,
            0.95,
            "xid-79",
            "xid",
            job_id="j1",
            attempt=0,
            culprit_nodes=("node-1",),
            culprit_ranks=(2,),
        ),
        Incident(
            "inc-sw",
            IncidentClass.CRASH,
            Cause.SOFTWARE,
            T0,
            T0 + dt.timedelta(seconds=1),
            0.95,
            "fp",
            "bug",
            job_id="j1",
            attempt=1,
            culprit_nodes=("node-0", "node-1"),
            fingerprint="fp-1",
        ),
    ]
    with SegmentSink(store_dir) as sink:
        sink.write("incidents", [i.to_row() for i in incidents])
    _checkpoint(tmp_path / "n0" / "step-00000010", 10, range(0, 2), 4)
    _checkpoint(tmp_path / "n1" / "step-00000010", 10, range(2, 4), 4)
    _checkpoint(tmp_path / "durable" / "step-00000005", 5, range(4), 4)
    tiers = [
        f"local@node-0={tmp_path / 'n0'}",
        f"local@node-1={tmp_path / 'n1'}",
        f"durable={tmp_path / 'durable'}",
    ]
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(f"format_version: 1\nhooks:\n  - {{type: file, name: spool, directory: "
                     f"'{tmp_path / 'spool'}'}}\n")
    return {
        "store": str(store_dir),
        "tiers": tiers,
        "hooks": str(hooks),
        "spool": tmp_path / "spool",
    }


def test_decide_then_deliver_then_list(setup: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["decide", "--store", setup["store"], "--tiers", *setup["tiers"], "--json"]) == 0
    decided = {row["incident_id"]: row for row in json.loads(capsys.readouterr().out)}
    assert (
        decided["inc-hw"]["action"] == "failover"
        and decided["inc-hw"]["restore"] == "durable step 5"
    )
    assert decided["inc-sw"]["action"] == "escalate"
    # a second pass decides nothing new: one decision per incident
    assert main(["decide", "--store", setup["store"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []

    assert main(["decisions", "--store", setup["store"], "--json"]) == 0
    assert {r["status"] for r in json.loads(capsys.readouterr().out)} == {"pending"}
    assert main(["deliver", "--store", setup["store"], "--hooks", setup["hooks"], "--json"]) == 0
    assert {r["status"] for r in json.loads(capsys.readouterr().out)} == {"delivered"}
    assert len(list(setup["spool"].glob("dec-*.json"))) == 2
    assert main(["decisions", "--store", setup["store"], "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["status"] for r in rows} == {"delivered"} and all(
        r["hooks"] == {"spool": "delivered"} for r in rows
    )
    assert main(["decisions", "--store", setup["store"]]) == 0  # the table form renders
    assert "dec-" in capsys.readouterr().out


def test_checkpoints_lists_and_shows_the_choice(setup: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["checkpoints", "--tiers", *setup["tiers"], "--exclude", "node-1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    chosen = [(r["tier"], r["step"]) for r in rows if r["chosen"]]
    assert chosen == [("durable", 5)]
    assert main(["checkpoints", "--tiers", *setup["tiers"]]) == 0
    assert "restore: step 10 from local" in capsys.readouterr().out
    assert (
        main(
            [
                "checkpoints",
                "--tiers",
                *setup["tiers"],
                "--record",
                "--job",
                "j1",
                "--store",
                setup["store"],
                "--json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(["sql", "--store", setup["store"], "--json", "SELECT count(*) AS n FROM checkpoints"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == [{"n": 3}]


def test_cli_errors_are_one_line_and_nonzero(
    setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad-policy.yaml"
    text = DEFAULT_POLICY_PATH.read_text()
    bad.write_text(text.replace("confidence_threshold: 0.6", "confidence_threshold: high"))
    assert main(["decide", "--store", setup["store"], "--policy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: confidence_threshold: expected a valid number, got 'high'" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["checkpoints", "--tiers", "tape=/dev/st0"]) == 2
    assert "expected local, peer or durable" in capsys.readouterr().err
    assert (
        main(["deliver", "--store", setup["store"], "--hooks", str(tmp_path / "missing.yaml")]) == 2
    )
    assert main(["decisions", "--store", str(tmp_path / "no-store")]) == 2


def test_hooks_from_arguments(setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["decide", "--store", setup["store"], "--json"]) == 0
    capsys.readouterr()
    drop = tmp_path / "drop"
    assert main(["deliver", "--store", setup["store"], "--drop-dir", str(drop), "--json"]) == 0
    assert {(r["hook"], r["status"]) for r in json.loads(capsys.readouterr().out)} == {
        ("file-0", "delivered")
    }
    assert len(list(drop.glob("dec-*.json"))) == 2
    assert main(["deliver", "--store", setup["store"]]) == 2
    assert "no hooks configured" in capsys.readouterr().err
