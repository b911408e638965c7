"""What the user reads of an incident in the HTML report, on the store of a real `faultlens demo`
run (torch DDP over gloo: a straggler, a hang, a SIGKILL, a lost GPU, a software bug, one attempt
each): each incident's nodes are its own attempt's, GPU charts span their window with axes, ticks
and a legend, the step heatmap shows the straggler's own work apart from its synchronised peers,
a killed rank's row runs to its death (and still does when the kill took all its step rows), and
the pages render in headless Chromium. Real-shaped step rows (pipeline stages, Megatron timers
sampled every N steps on one rank per tensor-parallel group, no sections) are written through the
real sink."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main
from faultlens.controller.report import data as report_data
from faultlens.controller.report.html import render_html

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def demo(request):
    """The demo run's store: the session's `faultlens demo` (conftest's demo_store), or the store an
    earlier run wrote, named in $FAULTLENS_DEMO_STORE (the demo takes minutes on a loaded machine).
    """
    reuse = os.environ.get("FAULTLENS_DEMO_STORE")
    store_path = Path(reuse) if reuse else request.getfixturevalue("demo_store").store
    with Store(str(store_path)) as store:
        [job] = [j["job_id"] for j in report_data.job_ids(store)]
        data = report_data.job_data(store, job)
    return store_path, job, data


def _by_class(data, cls, cause=None):
    return [
        i for i in data["incidents"] if i["class"] == cls and (cause is None or i["cause"] == cause)
    ]


def test_each_incident_names_the_nodes_of_its_own_attempt(demo):
    _, _, data = demo
    nodes_of = {a["attempt"]: a["nodes"] for a in data["attempts"]}
    assert len({tuple(n) for n in nodes_of.values()}) > 1  # the attempts ran on different nodes
    for incident, around in zip(data["incidents"], data["gpu_around"], strict=True):
        own = nodes_of[incident["attempt"] or 0]
        if incident["culprit_nodes"]:
            assert around["nodes"] == list(incident["culprit_nodes"])
        else:
            assert around["nodes"] == own[: report_data.GPU_NODES]
        assert set(around["nodes"]) <= set(own)
    html = render_html(data)
    [software] = _by_class(data, "crash", "software")
    attempt = software["attempt"]
    assert not software["culprit_nodes"]
    assert f"attempt {attempt} ran on {', '.join(nodes_of[attempt])}" in html
    heading = re.search(rf'<h3 id="gpu-{software["incident_id"]}">([^<]*)</h3>', html).group(1)
    assert heading.endswith(", ".join(nodes_of[attempt]))


def _charts(html, incident_id):
    part = html.split(f'<h3 id="gpu-{incident_id}">', 1)[1].split("<h3", 1)[0]
    return re.findall(r'<svg[^>]*class="gpu-chart".*?</svg>', part, re.S), part


def test_gpu_charts_span_their_window_with_axes_ticks_and_legend(demo):
    _, _, data = demo
    ends = {a["attempt"]: a["end"] for a in data["attempts"]}
    html = render_html(data)
    for incident, around in zip(data["incidents"], data["gpu_around"], strict=True):
        if not around["samples"]:
            continue
        end = ends[incident["attempt"] or 0]
        assert around["to"] <= end + dt.timedelta(seconds=report_data.GPU_TAIL_S)
        last = max(s["ts"] for s in around["samples"])
        # the nodes are sampled to the attempt's end: the samples reach the window's end
        assert (around["to"] - last).total_seconds() <= report_data.GPU_TAIL_S + 3.0
        charts, part = _charts(html, incident["incident_id"])
        assert len(charts) == 4
        for chart in charts:
            assert chart.count('class="ytick"') >= 3 and chart.count('class="xtick"') >= 3
            assert "seconds from the first signal" in chart
            xs = [
                float(p.split(",")[0])
                for pts in re.findall(r'points="([^"]+)"', chart)
                for p in pts.split()
            ]
            left, right = 52, 462
            assert max(xs) >= right - 0.15 * (right - left), "the lines stop part way across"
        series = {s["node"] + f" GPU {s['gpu_index']}" for s in around["samples"]}
        legend = part.split('class="legend gpu-legend"', 1)[1]
        assert all(name in legend for name in series)
    [straggler] = _by_class(data, "straggler")
    _, part = _charts(html, straggler["incident_id"])
    legend = part.split('class="legend gpu-legend"', 1)[1]
    assert re.search(r"node-\d+ GPU \d \(culprit\)", legend)


def _shares(html, attempt):
    block = html.split(f'<div id="heatmap-a{attempt}">', 1)[1].split("</div>", 1)[0]
    shares: dict[int, list[tuple[int, float]]] = {}
    for rank, step, share in re.findall(
        r'data-rank="(\d+)" data-step="(\d+)" data-share="([-\d.na]+)"', block
    ):
        if share != "nan":
            shares.setdefault(int(rank), []).append((int(step), float(share)))
    return shares, block


def test_heatmap_tells_the_straggler_apart_from_its_waiting_peers(demo):
    _, _, data = demo
    [straggler] = _by_class(data, "straggler")
    attempt, [culprit] = straggler["attempt"] or 0, straggler["culprit_ranks"]
    assert data["steps"]["basis"] == "own"
    html = render_html(data)
    shares, block = _shares(html, attempt)
    start = straggler.get("step") or 0
    late = {r: [s for step, s in v if step >= start] for r, v in shares.items()}
    assert statistics.median(late[culprit]) >= 0.3
    for rank, values in late.items():
        if rank != culprit:
            assert statistics.median(values) <= 0.1, (rank, values)
    # while the step time itself is the same for every rank: DDP peers wait for it
    cells = [c for c in data["steps"]["cells"] if c["attempt"] == attempt and c["step"] >= start]
    times = {r: statistics.median(c["seconds"] for c in cells if c["rank"] == r) for r in shares}
    assert max(times.values()) / min(times.values()) < 1.2
    assert f'class="culprit-label">rank {culprit} &#9664;' in block
    table = data["steps"]["sections"][attempt]
    worst = table["ranks"][0]
    assert worst["rank"] == culprit
    slow = max(worst["seconds"], key=lambda n: worst["seconds"][n] / (table["median"][n] or 1e-9))
    assert worst["seconds"][slow] >= 2 * table["median"][slow]


def _sigkill(data):
    [killed] = [i for i in data["incidents"] if "SIGKILL" in (i.get("summary") or "")]
    return killed, killed["attempt"] or 0, killed["culprit_ranks"][0]


def test_killed_rank_row_runs_to_its_death(demo):
    _, _, data = demo
    _, attempt, rank = _sigkill(data)
    grid = data["steps"]
    beats = [r for r in grid["reached"] if r["attempt"] == attempt and r["rank"] == rank]
    last_step = max(
        [c["step"] for c in grid["cells"] if c["attempt"] == attempt and c["rank"] == rank]
        + [b["beat_step"] for b in beats]
    )
    peers_last = max(c["step"] for c in grid["cells"] if c["attempt"] == attempt)
    assert last_step >= peers_last  # its row reaches the last step any rank reached
    html = render_html(data)
    _, block = _shares(html, attempt)
    assert re.search(rf'class="exit" data-rank="{rank}"><title>rank {rank} [^<]*SIGKILL', block)


@pytest.fixture(scope="module")
def killed_without_rows(demo, tmp_path_factory):
    """The demo's store with the killed rank's step rows of that attempt gone, as when the kill
    comes before the step timer's first flush (its heartbeats and exit remain)."""
    store, job, data = demo
    _, attempt, rank = _sigkill(data)
    copy = tmp_path_factory.mktemp("killed") / "store"
    shutil.copytree(store, copy)
    shutil.rmtree(copy / "steps")
    with Store(str(store)) as reader:
        rows = reader.query(
            "SELECT * FROM steps WHERE NOT (coalesce(attempt, 0) = ? AND rank = ?)", [attempt, rank]
        )
    with SegmentSink(copy) as sink:
        sink.write("steps", rows)
    return copy, job, attempt, rank


def test_killed_rank_without_any_step_row_still_has_its_row(killed_without_rows):
    store, job, attempt, rank = killed_without_rows
    with Store(str(store)) as reader:
        data = report_data.job_data(reader, job, attempt=attempt)
    assert [a["attempt"] for a in data["attempts"]] == [attempt]
    assert rank in data["steps"]["ranks"][attempt]
    assert not [c for c in data["steps"]["cells"] if c["rank"] == rank]
    html = render_html(data)
    _, block = _shares(html, attempt)
    assert f"rank {rank} &#9664;" in block
    assert re.search(rf'class="reached" data-rank="{rank}"', block)
    assert re.search(rf'class="exit" data-rank="{rank}"><title>[^<]*SIGKILL', block)


# -- real-shaped step rows through the real sink ------------------------------------------------

T0 = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)


def _write(store_dir: Path, job: str, ranks: list[dict], steps: list[dict]) -> None:
    with SegmentSink(store_dir) as sink:
        sink.write("ranks", ranks)
        sink.write("steps", steps)


def _pipeline_rows(job: str, slow: int, stages: int = 2, replicas: int = 2, n: int = 30):
    """Stage s of replica d is rank d * stages + s; stage 1 times its wait for stage 0 as the
    user named it (`wait_act`, `comm/loss`); rank `slow` computes its forward 2.5x longer, its
    replica's other stages wait for it."""
    ranks, steps = [], []
    for d in range(replicas):
        for s in range(stages):
            rank = d * stages + s
            ranks.append(
                {
                    "ts": T0,
                    "node": f"node-{rank // 2}",
                    "job_id": job,
                    "attempt": 0,
                    "rank": rank,
                    "world_size": stages * replicas,
                    "pp_rank": s,
                    "dp_rank": d,
                    "pp_size": stages,
                }
            )
    for step in range(n):
        slow_d = slow // stages
        for d in range(replicas):
            for s in range(stages):
                rank = d * stages + s
                forward = 0.05 * (1.0 + 0.02 * ((step * 7 + rank) % 5))
                if rank == slow:
                    forward *= 2.5
                wait = 0.075 if (d == slow_d and rank != slow) else 0.003
                sections = {
                    "forward": forward,
                    "backward": 0.026,
                    "wait_act": wait,
                    "comm": 0.004,
                    "comm/loss": 0.003 + (wait if s == stages - 1 else 0),
                }
                duration = 0.2 + (0.075 if d == slow_d else 0)
                start = T0 + dt.timedelta(seconds=step * 0.3)
                steps.append(
                    {
                        "ts": start,
                        "node": f"node-{rank // 2}",
                        "job_id": job,
                        "attempt": 0,
                        "rank": rank,
                        "step": step,
                        "phase": "train",
                        "start_ts": start,
                        "end_ts": start + dt.timedelta(seconds=duration),
                        "duration_s": duration,
                        "sections": sections,
                    }
                )
    return ranks, steps


def _megatron_rows(job: str, slow: int, workers: int = 16, every: int = 28, n: int = 12):
    """One reporting rank per tensor-parallel group of 4 (world size 64), step rows every
    `every` steps (a log interval), 46 s steps, Megatron's timer names."""
    ranks, steps = [], []
    for w in range(workers):
        rank = w * 4
        ranks.append(
            {
                "ts": T0,
                "node": f"node-{w}",
                "job_id": job,
                "attempt": 0,
                "rank": rank,
                "world_size": 64,
                "pp_rank": w % 4,
                "dp_rank": w // 4,
                "pp_size": 4,
            }
        )
    for k in range(n):
        step = 5 + k * every
        for w in range(workers):
            rank = w * 4
            factor = 2.4 if rank == slow else 1.0 + 0.03 * ((k + w) % 3)
            sections = {
                "forward-compute": 9.0 * factor,
                "backward-compute": 18.0 * factor,
                "forward-recv": 24.0 if (w // 4 == slow // 16 and rank != slow) else 0.5,
                "backward-send": 0.4,
                "optimizer": 1.2,
                "grads-all-reduce": 0.9,
            }
            start = T0 + dt.timedelta(seconds=step * 46.6)
            steps.append(
                {
                    "ts": start,
                    "node": f"node-{w}",
                    "job_id": job,
                    "attempt": 0,
                    "rank": rank,
                    "step": step,
                    "phase": "train",
                    "start_ts": start,
                    "end_ts": start + dt.timedelta(seconds=46.6),
                    "duration_s": 46.6,
                    "sections": sections,
                }
            )
    return ranks, steps


@pytest.mark.parametrize(
    "shape, slow", [("pipeline", 0), ("pipeline", 3), ("megatron", 0), ("megatron", 36)]
)
def test_heatmap_finds_the_slow_worker_in_real_shaped_rows(store_dir, shape, slow):
    job = f"{shape}-{slow}"
    rows = _pipeline_rows(job, slow) if shape == "pipeline" else _megatron_rows(job, slow)
    _write(store_dir, job, *rows)
    with Store(str(store_dir)) as store:
        grid = report_data.step_grid(store, job, [0])
    assert grid["basis"] == "own"
    excess: dict[int, list[float]] = {}
    for cell in grid["cells"]:
        excess.setdefault(cell["rank"], []).append(cell["excess_s"] / cell["step_median_s"])
    medians = {rank: statistics.median(v) for rank, v in excess.items()}
    assert max(medians, key=medians.get) == slow
    assert medians[slow] >= 0.2
    assert all(v <= 0.06 for rank, v in medians.items() if rank != slow), medians
    # every reporting rank has its row; the columns are the logged steps only
    assert sorted(medians) == sorted({r["rank"] for r in rows[0]})
    assert grid["sections"][0]["ranks"][0]["rank"] == slow


def test_heatmap_without_sections_falls_back_to_step_time(store_dir):
    job = "plain"
    ranks = [{"ts": T0, "node": "node-0", "job_id": job, "attempt": 0, "rank": r} for r in range(4)]
    steps = [
        {
            "ts": T0,
            "node": "node-0",
            "job_id": job,
            "attempt": 0,
            "rank": r,
            "step": s,
            "phase": "train",
            "start_ts": T0,
            "end_ts": T0,
            "duration_s": 0.5 if r == 2 else 0.2,
        }
        for s in range(10)
        for r in range(4)
    ]
    _write(store_dir, job, ranks, steps)
    with Store(str(store_dir)) as store:
        data = report_data.job_data(store, job)
    assert data["steps"]["basis"] == "step"
    html = render_html(data)
    shares, _ = _shares(html, 0)
    assert min(s for _, s in shares[2]) >= 1.0 and max(s for _, s in shares[0]) == 0.0
    assert "No own-work sections are timed" in html


def test_gpu_window_is_drawn_whole_at_any_sampling_rate(store_dir):
    """40,000 samples in the window (10 Hz, 4 nodes x 8 GPUs, 125 s): the old row limit of 20,000
    cut the charts off half way; the buckets keep the whole window."""
    rows = [
        {
            "ts": T0 + dt.timedelta(seconds=i / 10),
            "node": f"node-{n}",
            "gpu_index": g,
            "gpu_uuid": f"GPU-{n}-{g}",
            "source": "nvml",
            "temp_c": 60.0 + g,
            "power_w": 300.0,
            "sm_clock_mhz": 1980,
            "gpu_util_pct": 97.0,
        }
        for i in range(1250)
        for n in range(4)
        for g in range(8)
    ]
    with SegmentSink(store_dir) as sink:
        sink.write("gpu_samples", rows)
    first = T0 + dt.timedelta(seconds=95)
    incident = {
        "incident_id": "inc-x",
        "culprit_nodes": [],
        "first_signal_ts": first,
        "detected_ts": first + dt.timedelta(seconds=5),
    }
    attempt = {
        "attempt": 0,
        "start": T0,
        "end": T0 + dt.timedelta(seconds=125),
        "nodes": [f"node-{n}" for n in range(4)],
    }
    with Store(str(store_dir)) as store:
        around = report_data.gpu_around(store, incident, attempt)
    assert len(around["samples"]) <= 4 * 8 * (report_data.GPU_POINTS + 1)
    last = max(s["ts"] for s in around["samples"])
    first_sample = min(s["ts"] for s in around["samples"])
    assert (around["to"] - last).total_seconds() <= report_data.GPU_TAIL_S + 1
    assert (first_sample - around["from"]).total_seconds() <= 6


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.parametrize("attempt", [None, "straggler", "killed"])
def test_report_renders_in_chromium(demo, tmp_path, capsys, attempt):
    store, job, data = demo
    page = tmp_path / "report.html"
    argv = ["report", "--store", str(store), "--job", job, "-o", str(page)]
    if attempt == "straggler":
        argv += ["--attempt", str(_by_class(data, "straggler")[0]["attempt"] or 0)]
    elif attempt == "killed":
        argv += ["--attempt", str(_sigkill(data)[1])]
    assert main(argv) == 0
    capsys.readouterr()
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
        timeout=180,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    dom = proc.stdout
    assert 'data-ready="6"' in dom
    assert dom.count('class="gpu-chart"') >= 4 and 'class="culprit-label"' in dom
    assert 'class="incidents"' in dom
