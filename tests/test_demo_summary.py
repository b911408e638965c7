"""The demo's closing summary, as a log file gets it (80 columns, not a terminal): every line fits,
no raw JSON, the software bug's culprit is the code (not `? rank 0,1,2,3`), and the HTML report it
wrote opens."""

from __future__ import annotations

import re


def test_summary_reads_in_a_log_file(demo_store):
    lines = demo_store.output.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert '{"action"' not in demo_store.output and '"decision_id"' not in demo_store.output
    assert "? rank" not in demo_store.output and "? ranks" not in demo_store.output
    text = " ".join(demo_store.output.split())
    assert re.search(r"found crash / software: the code \(every rank that ran it: 0-3\)", text), (
        text[-3000:]
    )
    for attempt in range(5):
        assert f"attempt {attempt} on node-" in text
    assert "escalated: faultlens incident --store" in text


def test_demo_writes_its_html_report_and_prints_the_path(demo_store):
    shown = re.search(r"report:\s+(\S+\.html)", demo_store.output)
    assert shown is not None, demo_store.output[-2000:]
    page = demo_store.store.parent / shown.group(1)  # relative to where the demo ran
    assert page.resolve() == (demo_store.workdir / "report.html").resolve() and page.is_file()
    html = page.read_text()
    for section in ("summary", "timeline", "heatmap", "gpu", "decisions", "goodput"):
        assert f'<section id="{section}">' in html
    assert html.count('class="tag failover"') == 4 and html.count('class="tag escalate"') == 1
