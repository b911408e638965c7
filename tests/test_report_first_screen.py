"""What the report shows first, read in headless Chromium (issue 33): on the store of a real
`faultlens demo` run (torch DDP over gloo; one fault per attempt: a straggler, a hang, a SIGKILL, a
lost GPU, a software bug), each attempt's page and the whole job's page,
laid out by the browser at 1040 x 800 and read back from its DOM.

- The verdict comes right after the title, on the first screen: each incident's culprit node and
  rank (or, for the code's fault, that no node is to blame), what it was and what was decided.
- (A healthy job's page names nobody: tests/test_run_cli.py, on a real healthy job.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faultlens.attribution.reading.store import Store
from faultlens.controller.report import data as report_data
from faultlens.controller.report.html import VERDICT_LINES, render_html
from faultlens.controller.report.wording import ranks_text
from tests.chromium_page import chromium, read_first_screens

SCREEN = 800


@pytest.fixture(scope="module")
def pages(request):
    """Every attempt's page and the whole job's, with their data, read in one Chromium run."""
    reuse = os.environ.get("FAULTLENS_DEMO_STORE")
    store_path = Path(reuse) if reuse else request.getfixturevalue("demo_store").store
    if chromium() is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run does)")
    datas = {}
    with Store(str(store_path)) as store:
        [job] = [j["job_id"] for j in report_data.job_ids(store)]
        whole = report_data.job_data(store, job)
        datas["job"] = whole
        for attempt in sorted({a["attempt"] for a in whole["attempts"]}):
            datas[f"attempt-{attempt}"] = report_data.job_data(store, job, attempt=attempt)
    read = read_first_screens({name: render_html(d) for name, d in datas.items()}, height=SCREEN)
    return {name: (datas[name], read[name]) for name in datas}


def _nodes(data) -> set[str]:
    return {n for a in data["attempts"] for n in a.get("nodes") or []}


def test_the_verdict_is_the_first_thing_after_the_title_on_every_page(pages):
    assert len(pages) >= 6  # the job and its attempts
    for name, (_, read) in pages.items():
        assert read["verdict"], name
        assert 0 < read["verdict_top"] < 150 and read["verdict_bottom"] <= SCREEN, (name, read)
        title, first = read["text"][0], read["text"][1]
        assert title.startswith("faultlens report: job"), (name, read["text"][:3])
        assert first in read["verdict"], (name, read["text"][:3])


def test_each_incident_page_names_its_culprit_node_and_rank_first(pages):
    seen = 0
    for name, (data, read) in pages.items():
        if name == "job" or not data["incidents"]:
            continue
        [incident] = data["incidents"]  # one fault per attempt
        verdict = read["verdict"]
        others = _nodes(data) - set(incident["culprit_nodes"] or ())
        if incident["culprit_nodes"]:
            seen += 1
            for node in incident["culprit_nodes"]:
                assert node in verdict, (name, verdict)
            # the culprit, named before anything else is said of the incident
            assert verdict.index(incident["culprit_nodes"][0]) < verdict.index(incident["class"])
            assert not any(node in verdict for node in others), (name, verdict)
            culprits = " ".join(read["culprits"])
            assert incident["culprit_nodes"][0] in culprits, (name, read["culprits"])
        else:
            assert "the code" in verdict or "no single node" in verdict, (name, verdict)
        ranks = incident["culprit_ranks"] or []
        if ranks:
            assert ranks_text(ranks) in verdict, (name, verdict)
        assert incident["class"] in verdict and incident["cause"] in verdict
    assert seen >= 3  # the straggler, the SIGKILL and the lost GPU name a node


def test_the_whole_job_page_lists_incidents_in_order_then_points_at_the_rest(pages):
    data, read = pages["job"]
    lines = [line for line in read["verdict"].splitlines() if line.strip()]
    named = data["incidents"][:VERDICT_LINES]
    for line, incident in zip(lines, named, strict=False):
        assert f"attempt {incident['attempt'] or 0}" in line and incident["class"] in line
    if len(data["incidents"]) > VERDICT_LINES:
        assert f"and {len(data['incidents']) - VERDICT_LINES} more" in lines[-1]
