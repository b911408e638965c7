"""`faultlens jobs`, `faultlens incident ID` and `faultlens report` over a store made by the
simulator, attributed by the engine and decided by the policy (the same path a real store takes);
the report opened in headless Chromium (Debian's chromium package, installed by .ci/run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from faultlens.attribution.goodput import goodput
from faultlens.controller.cli.main import main

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("views")
    store = root / "store"
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


def _json(capsys) -> object:
    return json.loads(capsys.readouterr().out)


def test_jobs_lists_each_job_with_its_counts_and_ettr(sim_store, capsys, monkeypatch):
    assert main(["jobs", "--store", str(sim_store), "--json"]) == 0
    jobs = _json(capsys)
    assert [j["job_id"] for j in jobs] == ["pretrain-0"]
    job = jobs[0]
    assert main(["sql", "--store", str(sim_store), "--json",
                 "SELECT count(DISTINCT incident_id) AS n FROM incidents"]) == 0
    assert job["incidents"] == _json(capsys)[0]["n"] > 0
    assert job["ettr"] == pytest.approx(goodput(str(sim_store), "pretrain-0").ettr, abs=1e-3)
    assert job["attempts"] >= 2 and "failover" in job["decisions"]
    assert job["state"] != "running"  # the simulated job's telemetry is months old
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["jobs", "--store", str(sim_store)]) == 0
    out = capsys.readouterr().out
    assert "pretrain-0" in out and max(len(line) for line in out.splitlines()) <= 80


def test_incident_view_and_json(sim_store, capsys, monkeypatch):
    assert main(["incidents", "--store", str(sim_store), "--json"]) == 0
    incident_id = _json(capsys)[0]["incident_id"]
    assert main(["incident", "--store", str(sim_store), incident_id, "--json"]) == 0
    data = _json(capsys)
    assert data["incident_id"] == incident_id and data["evidence"] and data["decisions"]
    assert data["decisions"][0]["policy_rule"]
    monkeypatch.setenv("COLUMNS", "80")
    # a prefix, without "inc-"
    assert main(["incident", "--store", str(sim_store), incident_id[4:10]]) == 0
    out = capsys.readouterr().out
    for label in ("what", "where", "when", "why", "evidence", "decision"):
        assert re.search(rf"^{label}\s", out, re.M), (label, out)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert data["rule"] in out.replace("\n          ", " ")


def test_incident_unknown_or_ambiguous_is_one_line_exit_2(sim_store, capsys):
    assert main(["incident", "--store", str(sim_store), "inc-ffffffffffff"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no incident" in err
    assert main(["incident", "--store", str(sim_store), "inc-"]) == 2
    assert "give more of the id" in capsys.readouterr().err


def test_report_unknown_job_is_one_line(sim_store, tmp_path, capsys):
    assert (
        main(["report", "--store", str(sim_store), "--job", "nope", "-o", str(tmp_path / "r.html")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no job 'nope'" in err and "pretrain-0" in err
    assert not (tmp_path / "r.html").exists()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_is_self_contained_and_renders_in_chromium(sim_store, tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["report", "--store", str(sim_store), "--job", "pretrain-0", "-o", str(page)]) == 0
    assert str(page) in capsys.readouterr().out
    html = page.read_text()
    for section in ("summary", "timeline", "heatmap", "gpu", "decisions", "goodput"):
        assert f'<section id="{section}">' in html
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html), (
        "the page must not fetch anything"
    )
    # the timeline/heatmap and the GPU charts were drawn
    assert "<rect" in html and "<polyline" in html
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run does)")
    profile = tmp_path / "profile"
    profile.mkdir()
    proc = subprocess.run(
        [
            browser,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    assert 'data-ready="6"' in dom  # the page's script ran to the end over its six sections
    for section in ("summary", "timeline", "heatmap", "gpu", "decisions", "goodput"):
        assert f'id="{section}"' in dom
