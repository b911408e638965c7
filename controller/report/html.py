"""`faultlens report --job J -o report.html`: one job as one self-contained HTML page.

Everything is inline (CSS, SVG drawn here, a few lines of script): the page opens from a file with
no network. Sections (their element ids): summary, timeline (attempts, incidents and decisions over
the goodput buckets), heatmap (mean step time per rank and step, per attempt, relative to the
attempt's median), gpu (GPU samples and events around each incident), decisions (each decision with
its incident's evidence), goodput (badput by cause). All text from the store is HTML-escaped.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from html import escape
from pathlib import Path
from typing import Any

from faultlens.attribution.reading.store import Store
from faultlens.controller.report.data import job_data
from faultlens.controller.report.wording import culprit_text, restore_text, seconds_text

SECTIONS = ("summary", "timeline", "heatmap", "gpu", "decisions", "goodput")
BUCKET_COLORS = {
    "productive": "#2e9e5b",
    "lost_work": "#d7263d",
    "checkpoint": "#3a7bd5",
    "startup": "#9aa5b1",
    "restart": "#f08a24",
    "decision": "#8e44ad",
    "detection": "#17a2b8",  # apart from restart's orange and an observation's yellow
    "unknown": "#d5dbe1",
}
GPU_METRICS = (
    ("temp_c", "temperature (C)"),
    ("sm_clock_mhz", "SM clock (MHz)"),
    ("power_w", "power (W)"),
    ("gpu_util_pct", "utilisation (%)"),
)
MAX_SERIES = 16
WIDTH = 960

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1000px;color:#1d2430;padding:0 12px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;
border-bottom:1px solid #dde2e8;padding-bottom:4px}h3{font-size:14px;margin:16px 0 4px}
.muted{color:#5b6675}.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #dde2e8;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f3f5f8}svg{display:block;margin:6px 0}
.legend span{display:inline-block;margin-right:12px}
.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;white-space:pre-wrap;
word-break:break-word}
.tag{display:inline-block;border-radius:3px;padding:0 5px;color:#fff;font-size:12px}
.failover{background:#2e9e5b}.escalate{background:#d7263d}.other{background:#5b6675}
.culprit{color:#d7263d;font-weight:bold}.id{white-space:nowrap}
#verdict{margin:10px 0 12px;padding:10px 14px;border-left:6px solid #d7263d;background:#fdf1f2;
font-size:18px;line-height:1.4}#verdict.ok{border-color:#2e9e5b;background:#eef8f1}
#verdict p{margin:2px 0}#verdict .what{color:#1d2430}#verdict .more{font-size:14px}
"""

SCRIPT = """
(function(){
  var sections = document.querySelectorAll('section[id]');
  var nav = document.getElementById('nav');
  sections.forEach(function(s){
    var a = document.createElement('a'); a.href = '#' + s.id;
    a.textContent = s.querySelector('h2').textContent;
    a.style.marginRight = '14px'; nav.appendChild(a);
  });
  document.body.setAttribute('data-ready', String(sections.length));
})();
"""


def _t(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.fromisoformat(str(value))


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


class _Axis:
    def __init__(self, start: dt.datetime, end: dt.datetime, left: float, right: float) -> None:
        self.start, self.end, self.left, self.right = start, end, left, right
        self.span = max((end - start).total_seconds(), 1e-6)

    def x(self, when: dt.datetime | None) -> float:
        if when is None:
            return self.left
        share = (when - self.start).total_seconds() / self.span
        return self.left + max(0.0, min(1.0, share)) * (self.right - self.left)

    def ticks(self, y: float, count: int = 6) -> str:
        parts = []
        for i in range(count + 1):
            seconds = self.span * i / count
            x = self.left + (self.right - self.left) * i / count
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 4}" stroke="#5b6675"/>'
                f'<text x="{x:.1f}" y="{y + 16}" font-size="11" text-anchor="middle" '
                'fill="#5b6675">'
                f"+{seconds_text(seconds)}</text>"
            )
        return "".join(parts)


def _timeline(data: dict[str, Any]) -> str:
    good = data.get("goodput") or {}
    attempts = data["attempts"]
    whole = data.get("only_attempt") is None  # one attempt's page: its own span
    starts = [_t(a["start"]) for a in attempts] + [_t(good.get("start")) if whole else None]
    ends = [_t(a["end"]) for a in attempts] + [_t(good.get("end")) if whole else None]
    ends += [_t(i.get("detected_ts")) for i in data["incidents"]] + [
        _t(d.get("issued_ts")) for d in data["decisions"]
    ]
    starts, ends = [s for s in starts if s], [e for e in ends if e]
    if not starts:
        return '<p class="muted">no telemetry with times for this job</p>'
    axis = _Axis(min(starts), max(ends + starts), 150, WIDTH - 50)
    rows = 1 + len(attempts)
    height = 30 + 26 * rows + 30
    parts = [f'<svg width="{WIDTH}" height="{height}" role="img" aria-label="timeline">']
    parts.append('<text x="0" y="30" font-size="12">goodput buckets</text>')
    pixel = axis.span / (axis.right - axis.left)
    for run in good.get("timeline") or []:
        s, e = _t(run["start"]), _t(run["end"])
        if s is None or e is None or (e - s).total_seconds() < pixel * 0.5:
            continue
        if e <= axis.start or s >= axis.end:
            continue
        s, e = max(s, axis.start), min(e, axis.end)
        x0, x1 = axis.x(s), axis.x(e)
        parts.append(
            f'<rect x="{x0:.1f}" y="18" width="{max(x1 - x0, 0.6):.1f}" height="18" '
            f'fill="{BUCKET_COLORS.get(run["bucket"], "#999")}"><title>{_e(run["bucket"])} '
            f"{(e - s).total_seconds():.1f} s</title></rect>"
        )
    for n, attempt in enumerate(attempts, 1):
        y = 18 + 26 * n
        x0, x1 = axis.x(_t(attempt["start"])), axis.x(_t(attempt["end"]))
        label = f"attempt {attempt['attempt']}"
        parts.append(
            f'<text x="0" y="{y + 13}" font-size="12">{_e(label)}</text>'
            f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="18" '
            'fill="#c9d6e8" '
            f'stroke="#7f95b3"><title>{_e(label)} on '
            f"{_e(', '.join(attempt['nodes'] or []))}</title></rect>"
            f'<text x="{x0 + 4:.1f}" y="{y + 13}" '
            f'font-size="11">{_e(", ".join(attempt["nodes"] or []))}'
            "</text>"
        )
    rows_of = {a["attempt"]: n for n, a in enumerate(attempts, 1)}
    for incident in data["incidents"]:
        y = 18 + 26 * rows_of.get(incident.get("attempt") or 0, 1)
        x0, x1 = (
            axis.x(_t(incident.get("first_signal_ts"))),
            axis.x(_t(incident.get("detected_ts"))),
        )
        tip = f"{incident['class']} / {incident['cause']}: {incident.get('summary') or ''}"
        parts.append(
            f'<line x1="{x0:.1f}" x2="{x1:.1f}" y1="{y + 9}" y2="{y + 9}" '
            'stroke="#d7263d" '
            f'stroke-width="3"/><path d="M{x1:.1f},{y - 2} l6,11 l-12,0 z" fill="#d7263d">'
            f"<title>{_e(tip)}</title></path>"
        )
    for seen in data.get("observations") or []:  # no incident: shown, never decided on
        ts = _t(seen.get("ts"))
        if ts is None or not axis.start <= ts <= axis.end:
            continue
        y = 18 + 26 * rows_of.get(seen.get("attempt") or 0, 1)
        parts.append(
            f'<circle class="observation" cx="{axis.x(ts):.1f}" cy="{y + 9}" r="4" '
            f'fill="#f2b705" stroke="#7a5c00"><title>observation, step {seen["step"]}: '
            f"{_e(seen['text'])}</title></circle>"
        )
    for decision in data["decisions"]:
        y = 18 + 26 * rows_of.get(decision.get("attempt") or 0, 1)
        x = axis.x(_t(decision.get("issued_ts")))
        color = "#2e9e5b" if decision["action"] == "failover" else "#d7263d"
        parts.append(
            f'<path d="M{x:.1f},{y + 9} l6,6 l-6,6 l-6,-6 z" fill="{color}" stroke="#fff">'
            f"<title>decision: {_e(decision['action'])} "
            f"({_e(decision.get('policy_rule'))})</title></path>"
        )
    parts.append(axis.ticks(18 + 26 * rows + 4))
    parts.append("</svg>")
    legend = "".join(
        f'<span><i class="sw" style="background:{c}"></i>{_e(b)}</span>'
        for b, c in BUCKET_COLORS.items()
    )
    legend += (
        '<span><b style="color:#d7263d">&#9650;</b> incident (a line from its first signal to '
        "its detection)</span>"
        "<span>&#9670; decision</span>"
        '<span><i class="sw" style="background:#f2b705;border-radius:50%"></i>observation (a '
        "spike that came back, one outlier step: no incident)</span>"
    )
    return "".join(parts) + f'<div class="legend muted">{legend}</div>'


def _heat_color(share: float) -> str:
    """White for no excess over the peers, deepening red up to half the step and more."""
    if share != share:  # NaN
        return "#eeeeee"
    level = max(0.0, min(1.0, (share - 0.03) / 0.47))
    r, g, b = 255, int(250 - 205 * level), int(246 - 216 * level)
    return f"#{r:02x}{g:02x}{b:02x}"


HATCH = (
    '<defs><pattern id="lost" width="5" height="5" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="5" height="5" fill="#d5dbe1"/>'
    '<line x1="0" y1="0" x2="0" y2="5" stroke="#8a96a3" stroke-width="2"/></pattern></defs>'
)


def _exit_text(row: dict[str, Any]) -> str:
    if row.get("signal"):
        return str(row["signal"])
    return f"exit {row.get('exit_code')}"


def _heat_caption(grid: dict[str, Any]) -> str:
    if grid["basis"] == "own":
        what = (
            "each rank's own work beyond its peers' at each step: section by section (compute "
            "and data; time waiting in collectives left out), what it spent above the median "
            "rank of its pipeline stage, as a share of the step's median time (white: none; "
            "red: half the step and more). Step time itself cannot tell a straggler apart: in "
            "a synchronous job its peers wait for it inside the step, so every rank's step "
            "takes as long"
        )
    else:
        what = (
            "each rank's step time beyond the step's median rank, as a share of it (white: "
            "none; red: half the step and more). No own-work sections are timed, so a "
            "straggler's synchronous peers look as slow as it does (time sections with the "
            "step timer to see the difference)"
        )
    notes = [
        "grey hatch: steps the rank completed (its heartbeats) with no step row, lost when "
        "its process died",
        "&#10005;: the rank exited (a signal, or a non-zero code)",
        "&#9664;: an incident's culprit rank",
    ]
    if grid["step_bucket"] > 1:
        notes.append(f"{grid['step_bucket']} steps per column")
    if grid["rank_bucket"] > 1:
        notes.append(f"{grid['rank_bucket']} ranks per row (the worst of them)")
    unknown = grid.get("unknown_sections") or []
    if unknown:
        notes.append(
            "sections of unknown kind left out: "
            + _e(", ".join(unknown[:8]))
            + (" ..." if len(unknown) > 8 else "")
        )
    return f'<p class="muted">{_e(what)}; ' + "; ".join(notes) + "</p>"


def _heatmap(data: dict[str, Any]) -> str:
    grid = data["steps"]
    cells = grid["cells"]
    ranks_of = grid.get("ranks") or {}
    if not cells and not any(ranks_of.values()):
        return (
            '<p class="muted">no step timings for this job '
            "(faultlens.collectors.training.step_timer writes "
            "them)</p>"
        )
    out = [_heat_caption(grid)]
    by_attempt: dict[int, list[dict[str, Any]]] = {a: [] for a, r in ranks_of.items() if r}
    for cell in cells:
        by_attempt.setdefault(cell["attempt"], []).append(cell)
    culprits: dict[int, set[int]] = {}
    for incident in data["incidents"]:
        culprits.setdefault(incident.get("attempt") or 0, set()).update(
            int(r) for r in incident.get("culprit_ranks") or []
        )
    nodes_of = {a["attempt"]: a.get("nodes") or [] for a in data["attempts"]}
    slow = {i.get("attempt") or 0 for i in data["incidents"] if i.get("class") == "straggler"}
    for attempt, mine in sorted(by_attempt.items()):
        out.append(
            _attempt_heatmap(
                grid, attempt, mine, culprits.get(attempt, set()), nodes_of.get(attempt, [])
            )
        )
        table = (grid.get("sections") or {}).get(attempt)
        if table:
            shown = _section_table(table, culprits.get(attempt, set()))
            if attempt in slow:
                out.append(shown)
            else:  # no straggler incident in this attempt: there on demand
                out.append(
                    f"<details><summary>own work per section, attempt {attempt}</summary>"
                    f"{shown}</details>"
                )
    return "".join(out)


def _attempt_heatmap(
    grid: dict[str, Any],
    attempt: int,
    mine: list[dict[str, Any]],
    culprits: set[int],
    nodes: list[str],
) -> str:
    bucket, rank_bucket = grid["step_bucket"], grid["rank_bucket"]
    reached = [r for r in grid.get("reached") or [] if r["attempt"] == attempt]
    exits = [r for r in grid.get("exits") or [] if r["attempt"] == attempt]
    steps = sorted({c["step"] for c in mine})
    ranks = sorted(set((grid.get("ranks") or {}).get(attempt) or []) | {c["rank"] for c in mine})
    if not steps:
        beat = [r["beat_step"] for r in reached]
        steps = sorted({(s // bucket) * bucket for s in beat})
    step_times = [
        c["step_median_s"] or c["seconds"]
        for c in mine
        if (c["step_median_s"] or c["seconds"]) is not None
    ]
    median = statistics.median(step_times) if step_times else 0.0
    label_w = 130
    cw = max(2.0, min(28.0, (WIDTH - label_w - 40) / max(len(steps) + 1, 1)))
    ch = max(3.0, min(16.0, 260 / max(len(ranks), 1)))
    sx = {s: i for i, s in enumerate(steps)}
    ry = {r: i for i, r in enumerate(ranks)}
    height = ch * len(ranks) + 34
    blamed = {(r // rank_bucket) * rank_bucket for r in culprits}
    title = f"attempt {attempt}: steps {steps[0]}..{steps[-1]}" if steps else f"attempt {attempt}"
    title += f" on {', '.join(nodes)}" if nodes else ""
    title += f", median step {median:.3f} s" if median else ""
    width = label_w + cw * (len(steps) + 1) + 20
    parts = [
        f'<div id="heatmap-a{attempt}"><h3>{_e(title)}</h3>'
        f'<svg width="{width:.0f}" height="{height:.0f}" role="img" '
        f'aria-label="own work heatmap, attempt {attempt}">{HATCH}'
    ]
    for r in ranks:
        if len(ranks) > 32 and r not in (ranks[0], ranks[-1]) and r not in blamed:
            continue
        label = f"rank {r}" if rank_bucket == 1 else f"ranks {r}-{r + rank_bucket - 1}"
        y = ry[r] * ch + ch - 1
        size = min(11, ch + 2)
        if r in blamed:
            parts.append(
                f'<text x="0" y="{y:.1f}" font-size="{size:.0f}" font-weight="bold" '
                f'fill="#d7263d" class="culprit-label">{_e(label)} &#9664;</text>'
            )
        else:
            parts.append(f'<text x="0" y="{y:.1f}" font-size="{size:.0f}">{_e(label)}</text>')
    for c in mine:
        seconds, ref = c["seconds"], c["step_median_s"] or 0.0
        if grid["basis"] == "own" and c["excess_s"] is not None:
            share = c["excess_s"] / ref if ref > 0 else float("nan")
            detail = (
                f"own work {c['own_s']:.3f} s, {c['excess_s']:.3f} s above its peers "
                f"({share:.0%} of the step)"
            )
        elif seconds is not None and ref > 0:
            share = max(0.0, seconds - ref) / ref
            detail = f"{share:.0%} above the step's median rank"
        else:
            share, detail = float("nan"), "no time"
        worst = c.get("worst_rank")
        who = f"rank {c['rank']}" if rank_bucket == 1 else f"ranks {c['rank']}.. (worst {worst})"
        step_text = f"step {c['step']}" if bucket == 1 else f"steps {c['step']}.."
        parts.append(
            f'<rect x="{label_w + sx[c["step"]] * cw:.1f}" y="{ry[c["rank"]] * ch:.1f}" '
            f'width="{cw:.1f}" height="{ch:.1f}" fill="{_heat_color(share)}" '
            f'data-rank="{c["rank"]}" data-step="{c["step"]}" data-share="{share:.3f}">'
            f"<title>{_e(who)} {_e(step_text)}: step "
            f"{'-' if seconds is None else f'{seconds:.3f} s'}; {_e(detail)}</title></rect>"
        )
    have = {(c["rank"], c["step"]) for c in mine}
    for r in reached:
        rank = (r["rank"] // rank_bucket) * rank_bucket
        if rank not in ry:
            continue
        lo = -1 if r["row_step"] is None else r["row_step"]
        for step in steps:
            if (rank, step) in have or not (lo < step <= r["beat_step"]):
                continue
            parts.append(
                f'<rect x="{label_w + sx[step] * cw:.1f}" y="{ry[rank] * ch:.1f}" '
                f'width="{cw:.1f}" height="{ch:.1f}" fill="url(#lost)" class="reached" '
                f'data-rank="{rank}" data-step="{step}"><title>rank {r["rank"]} completed step '
                f"{step} (its heartbeat) but its step row was never written: the process died "
                f"before its timer's next flush</title></rect>"
            )
    last_reached = {((r["rank"] // rank_bucket) * rank_bucket): r["beat_step"] for r in reached}
    for r in exits:
        rank = (r["rank"] // rank_bucket) * rank_bucket
        if rank not in ry:
            continue
        done = [c["step"] for c in mine if c["rank"] == rank]
        last = max([*done, last_reached.get(rank, -1)])
        after = [s for s in steps if s > last]
        x = label_w + (sx[after[0]] if after else len(steps)) * cw
        when = _t(r["ts"])
        tip = (
            f"rank {r['rank']} on {r.get('node') or '?'} exited: {_exit_text(r)}"
            + (f" at {when.strftime('%H:%M:%S')}" if when else "")
            + (f", after step {last}" if last >= 0 else ", before any step")
        )
        color = "#d7263d" if rank in blamed else "#5b6675"
        parts.append(
            f'<text x="{x + cw / 2:.1f}" y="{ry[rank] * ch + ch - 1:.1f}" '
            f'font-size="{min(13, ch + 3):.0f}" text-anchor="middle" fill="{color}" '
            f'class="exit" data-rank="{rank}"><title>{_e(tip)}</title>&#10005;</text>'
        )
    y = ch * len(ranks) + 14
    if steps and cw * len(steps) >= 120:
        parts.append(
            f'<text x="{label_w}" y="{y:.0f}" font-size="11" fill="#5b6675">step '
            f"{steps[0]}</text>"
            f'<text x="{label_w + cw * len(steps):.0f}" y="{y:.0f}" font-size="11" '
            f'fill="#5b6675" text-anchor="end">step {steps[-1]}</text>'
        )
    parts.append("</svg></div>")
    return "".join(parts)


def _section_table(table: dict[str, Any], culprits: set[int]) -> str:
    names = table["names"]
    median = table["median"]
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    rows = [
        "<tr><td>median rank</td>"
        + "".join(f"<td>{median.get(n, 0) or 0:.3f}</td>" for n in names)
        + "<td>-</td></tr>"
    ]
    for entry in table["ranks"]:
        rank = entry["rank"]
        cells = []
        for n in names:
            own, peer = entry["seconds"].get(n), median.get(n)
            if own is None:
                cells.append("<td>-</td>")
                continue
            ratio = own / peer if peer else float("nan")
            hot = ratio == ratio and ratio >= 1.25 and own - (peer or 0) >= 0.001
            style = ' style="background:#ffd4cc;font-weight:bold"' if hot else ""
            shown = f" ({ratio:.1f}x)" if ratio == ratio else ""
            cells.append(f"<td{style}>{own:.3f}{shown}</td>")
        label = f"rank {rank}" + (" &#9664; culprit" if rank in culprits else "")
        style = ' style="color:#d7263d;font-weight:bold"' if rank in culprits else ""
        rows.append(
            f"<tr><td{style}>{label}</td>"
            + "".join(cells)
            + f"<td>{entry['excess_s'] or 0:.3f}</td></tr>"
        )
    return (
        '<table class="sections"><tr><th>own work per step, median s</th>'
        + head
        + "<th>above peers s</th></tr>"
        + "".join(rows)
        + "</table>"
    )


PALETTE = (
    "#1f77b4",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#17becf",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
CULPRIT_COLOR = "#d62728"


def _nice_step(span: float, count: int, at_least: int = 3) -> float:
    """A round tick step for `span` near `count` ticks, never fewer than `at_least` ticks inside
    the span (a step of 10 over a 25 s window would leave two)."""
    raw = max(span / max(count, 1), 1e-9)
    power = 10 ** math.floor(math.log10(raw))
    step = next((f * power for f in (1, 2, 2.5, 5, 10) if raw <= f * power), 10 * power)
    while span > 0 and span / step < at_least and step > 1e-9:
        step /= 2
    return step


def _series_key(sample: dict[str, Any]) -> tuple[str, str, str]:
    index = sample.get("gpu_index")
    label = f"{sample['node']} GPU {index if index is not None else sample.get('gpu_uuid') or '?'}"
    return (label, str(index) if index is not None else "", str(sample.get("gpu_uuid") or ""))


def _series_colors(
    samples: list[dict[str, Any]], incident: dict[str, Any]
) -> dict[str, tuple[str, bool]]:
    """Series label -> (colour, culprit GPU?): the culprit's GPUs red, the others from PALETTE."""
    nodes = set(incident.get("culprit_nodes") or [])
    gpus = {str(g) for g in incident.get("culprit_gpus") or []}
    keys = sorted({_series_key(s) for s in samples})[:MAX_SERIES]
    colors: dict[str, tuple[str, bool]] = {}
    others = 0
    for label, index, uuid in keys:
        node = label.split(" GPU ", 1)[0]
        blamed = bool(gpus) and node in nodes and (index in gpus or uuid in gpus)
        if blamed:
            colors[label] = (CULPRIT_COLOR, True)
        else:
            colors[label] = (PALETTE[others % len(PALETTE)], False)
            others += 1
    return colors


def _line_chart(
    samples: list[dict[str, Any]],
    metric: str,
    label: str,
    lo: dt.datetime,
    hi: dt.datetime,
    marks: list[tuple[dt.datetime | None, str, str]],
    colors: dict[str, tuple[str, bool]],
    origin: dt.datetime,
) -> str:
    """One metric over the whole window [lo, hi]: an x axis in seconds from `origin` (the first
    signal), y ticks, a line per GPU in its legend colour (the culprit's thick and red)."""
    series: dict[str, list[tuple[dt.datetime, float]]] = {}
    for s in samples:
        value = s.get(metric)
        if value is None or value != value:
            continue
        key = _series_key(s)[0]
        if key in colors:
            series.setdefault(key, []).append((_t(s["ts"]), float(value)))
    if not series:
        return ""
    values = [v for points in series.values() for _, v in points]
    step = _nice_step(max(values) - min(values) or 1.0, 4)
    vmin = math.floor(min(values) / step) * step
    vmax = math.ceil(max(values) / step) * step
    if vmax - vmin < step:
        vmin, vmax = vmin - step, vmax + step
    w, h, left, right, top, bottom = 470, 168, 52, 462, 18, 132
    axis = _Axis(lo, hi, left, right)

    def y(v: float) -> float:
        return top + (bottom - top) * (1 - (v - vmin) / (vmax - vmin))

    parts = [
        f'<svg width="{w}" height="{h}" role="img" aria-label="{_e(label)}" class="gpu-chart" '
        f'data-metric="{metric}">'
        f'<text x="{left}" y="11" font-size="12" font-weight="bold">{_e(label)}</text>'
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
        'fill="none" stroke="#c3cad3"/>'
    ]
    tick = vmin
    while tick <= vmax + step * 1e-6:
        ty = y(tick)
        text = f"{tick:.0f}" if step >= 1 else f"{tick:.1f}"
        parts.append(
            f'<line x1="{left - 4}" x2="{right}" y1="{ty:.1f}" y2="{ty:.1f}" '
            f'stroke="#eef1f4"/><text x="{left - 6}" y="{ty + 4:.1f}" font-size="10" '
            f'text-anchor="end" fill="#5b6675" class="ytick">{text}</text>'
        )
        tick += step
    span = (hi - lo).total_seconds()
    xstep = _nice_step(span, 5)
    offset_lo = (lo - origin).total_seconds()
    first_tick = math.ceil(offset_lo / xstep) * xstep
    t = first_tick
    while t <= offset_lo + span + 1e-6:
        tx = axis.x(origin + dt.timedelta(seconds=t))
        text = "0" if abs(t) < 1e-9 else f"{t:+g} s"
        parts.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{bottom}" y2="{bottom + 4}" '
            f'stroke="#5b6675"/><text x="{tx:.1f}" y="{bottom + 15}" font-size="10" '
            f'text-anchor="middle" fill="#5b6675" class="xtick">{_e(text)}</text>'
        )
        t += xstep
    parts.append(
        f'<text x="{(left + right) / 2:.0f}" y="{h - 4}" font-size="10" '
        'text-anchor="middle" fill="#5b6675">seconds from the first signal</text>'
    )
    for when, text, color in marks:
        if when is not None and lo <= when <= hi:
            x = axis.x(when)
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{bottom}" '
                f'stroke="{color}" stroke-dasharray="4,3"><title>{_e(text)}</title>'
                "</line>"
            )
    ordered = sorted(series, key=lambda k: colors[k][1])  # the culprit's line on top
    for key in ordered:
        color, blamed = colors[key]
        points = " ".join(f"{axis.x(t):.1f},{y(v):.1f}" for t, v in series[key])
        parts.append(
            f'<polyline fill="none" stroke="{color}" '
            f'stroke-width="{2.6 if blamed else 1.4}" data-series="{_e(key)}" '
            f'points="{points}"><title>{_e(key)}</title></polyline>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend(colors: dict[str, tuple[str, bool]]) -> str:
    items = []
    for key, (color, blamed) in colors.items():
        text = _e(key) + (" (culprit)" if blamed else "")
        weight = ";font-weight:bold;color:#d7263d" if blamed else ""
        items.append(
            f'<span style="white-space:nowrap{weight}"><i class="sw" '
            f'style="background:{color}"></i>{text}</span>'
        )
    items.append(
        '<span><i class="sw" style="background:none;border-left:2px dashed #d7263d">'
        "</i>first signal, detection</span>"
    )
    items.append(
        '<span><i class="sw" style="background:none;border-left:2px dashed #5b6675">'
        "</i>attempt ended</span>"
    )
    return '<div class="legend gpu-legend">' + "".join(items) + "</div>"


def _gpu(data: dict[str, Any]) -> str:
    if not data["incidents"]:
        return '<p class="muted">no incidents</p>'
    ends = {a["attempt"]: _t(a.get("end")) for a in data["attempts"]}
    out = []
    for around, incident in zip(data["gpu_around"], data["incidents"], strict=True):
        attempt = incident.get("attempt") or 0
        whose = "culprit node" if incident.get("culprit_nodes") else f"nodes of attempt {attempt}"
        out.append(
            f'<h3 id="gpu-{_e(incident["incident_id"])}">{_e(incident["incident_id"])}: '
            f"{_e(incident['class'])} / {_e(incident['cause'])}, attempt {attempt}, "
            f"{whose}: {_e(', '.join(around['nodes']) or '-')}</h3>"
        )
        if not around["samples"] and not around["events"]:
            out.append(
                '<p class="muted">no GPU samples or events on these nodes around the incident</p>'
            )
            continue
        lo, hi = _t(around["from"]), _t(around["to"])
        first = _t(incident.get("first_signal_ts")) or _t(incident.get("detected_ts")) or lo
        detected = _t(incident.get("detected_ts"))
        marks = [
            (first, "first signal", "#d7263d"),
            (detected, "detected", "#d7263d"),
            (ends.get(attempt), f"attempt {attempt}: last telemetry", "#5b6675"),
        ]
        sources = sorted({str(s.get("source")) for s in around["samples"] if s.get("source")})
        notes = [
            f"{_e(lo.strftime('%H:%M:%S'))} to {_e(hi.strftime('%H:%M:%S'))} UTC; 0 s: the "
            f"first signal at {_e(first.strftime('%H:%M:%S'))}"
        ]
        if detected is not None and detected > hi:
            notes.append(
                f"detected {seconds_text((detected - first).total_seconds())} after it, "
                "after the attempt ended (off the chart)"
            )
        if sources:
            fake = set(sources) & {"recorded", "simulated", "sim"}
            notes.append(
                f"sample source: {_e(', '.join(sources))}"
                + (
                    " (a recorded or simulated GPU backend, not a live NVML reading)"
                    if fake
                    else ""
                )
            )
        out.append(f'<p class="muted">{"; ".join(notes)}</p>')
        colors = _series_colors(around["samples"], incident)
        charts = [
            _line_chart(around["samples"], m, label, lo, hi, marks, colors, first)
            for m, label in GPU_METRICS
        ]
        if any(charts):
            out.append(
                '<div style="display:flex;flex-wrap:wrap;gap:4px 12px">'
                + "".join(c for c in charts if c)
                + "</div>"
                + _legend(colors)
            )
        if around["events"]:
            rows = "".join(
                f"<tr><td>{_e(_t(e['ts']).strftime('%H:%M:%S.%f')[:-3])}</td><td>{_e(e['node'])}</td>"
                f"<td>{_e(e['gpu_index'])}</td><td>{_e(e['kind'])}</td><td>{_e(e['code'])}</td>"
                f'<td class="mono">{_e(e["message"])}</td></tr>'
                for e in around["events"]
            )
            out.append(
                "<table><tr><th>time</th><th>node</th><th>GPU</th><th>kind</th><th>code</th>"
                f"<th>message</th></tr>{rows}</table>"
            )
    return "".join(out)


def _decisions(data: dict[str, Any]) -> str:
    incidents = {i["incident_id"]: i for i in data["incidents"]}
    nodes_of = {a["attempt"]: a.get("nodes") or [] for a in data["attempts"]}
    if not data["decisions"] and not data["incidents"]:
        return '<p class="muted">no incidents, no decisions</p>'
    out = []
    decided = set()
    for decision in data["decisions"]:
        incident = incidents.get(decision["incident_id"], {})
        decided.add(decision["incident_id"])
        tag = decision["action"] if decision["action"] in ("failover", "escalate") else "other"
        restore = (
            "-"
            if decision.get("restore_step") is None
            else restore_text(decision["restore_step"], decision.get("restore_tier"))
        )
        excluded = ", ".join(decision.get("exclude_nodes") or []) or "-"
        out.append(
            f'<h3><span class="tag {tag}">{_e(decision["action"])}</span> '
            f"{_e(decision['incident_id'])} "
            f"(attempt {_e(decision.get('attempt'))})</h3>"
        )
        out.append(
            _incident_kv(incident, nodes_of) + '<div class="kv">'
            f"<b>policy rule</b><span>{_e(decision.get('policy_rule'))}</span>"
            f"<b>reason</b><span>{_e(decision.get('reason'))}</span>"
            f"<b>exclude</b><span>{_e(excluded)}</span>"
            f"<b>restore</b><span>{_e(restore)}</span></div>"
        )
        out.append(_evidence(incident))
    for incident_id, incident in incidents.items():
        if incident_id not in decided:
            out.append(
                f'<h3><span class="tag other">no decision</span> {_e(incident_id)}</h3>'
                + _incident_kv(incident, nodes_of)
                + _evidence(incident)
            )
    return "".join(out)


def _where(incident: dict[str, Any], attempt_nodes: dict[int, list[str]]) -> str:
    """The culprit; with no culprit node, the nodes the incident's own attempt ran on."""
    text = culprit_text(
        incident.get("culprit_nodes"),
        incident.get("culprit_ranks"),
        incident.get("culprit_gpus"),
        incident.get("cause"),
    )
    nodes = attempt_nodes.get(incident.get("attempt") or 0) or []
    if not incident.get("culprit_nodes") and nodes:
        text += f"; attempt {incident.get('attempt') or 0} ran on {', '.join(nodes)}"
    return text


def _incident_kv(incident: dict[str, Any], attempt_nodes: dict[int, list[str]]) -> str:
    if not incident:
        return ""
    return (
        '<div class="kv">'
        f"<b>what</b><span>{_e(incident.get('class'))} / {_e(incident.get('cause'))}: "
        f"{_e(incident.get('summary'))}</span><b>where</b>"
        f'<span class="culprit">{_e(_where(incident, attempt_nodes))}</span>'
        f"<b>rule</b><span>{_e(incident.get('rule'))}, confidence "
        f"{incident.get('confidence') or 0:.2f}</span>"
        "</div>"
    )


def _evidence(incident: dict[str, Any]) -> str:
    items = sorted(
        incident.get("evidence") or [],
        key=lambda e: (e["ts"] is None, _t(e["ts"]) or dt.datetime.min),
    )
    if not items:
        return ""
    first = _t(incident.get("first_signal_ts"))
    rows = []
    for item in items:
        when = _t(item["ts"])
        offset = "" if when is None or first is None else f"{(when - first).total_seconds():+.1f} s"
        rows.append(
            f"<tr><td>{_e(offset)}</td><td>{_e(item['table'])}</td>"
            f'<td class="mono">{_e(item["text"])}</td></tr>'
        )
    return (
        "<table><tr><th>time</th><th>table</th><th>evidence</th></tr>" + "".join(rows) + "</table>"
    )


def _goodput(data: dict[str, Any]) -> str:
    good = data.get("goodput")
    if not good:
        return '<p class="muted">no goodput accounting for this job (no attempts with times)</p>'
    wall = good["wall_s"] or 1e-9
    buckets = {"productive": good["productive_s"], **good["badput_s"]}
    bar = "".join(
        f'<rect x="{sum(list(buckets.values())[:i]) / wall * WIDTH:.1f}" y="0" '
        f'width="{v / wall * WIDTH:.1f}" height="22" '
        f'fill="{BUCKET_COLORS.get(k, "#999")}"><title>{_e(k)} '
        f"{v:.1f} s</title></rect>"
        for i, (k, v) in enumerate(buckets.items())
    )
    rows = "".join(
        '<tr><td><i class="sw" '
        f'style="background:{BUCKET_COLORS.get(k, "#999")}"></i>{_e(k)}</td>'
        f"<td>{v:.1f}</td><td>{v / wall:.1%}</td></tr>"
        for k, v in buckets.items()
        if v > 0
    )
    costs = "".join(
        f"<tr><td>{_e(c['incident_id'])}</td><td>{_e(c['class'])} / "
        f"{_e(c['cause'])}</td>"
        f"<td>{_e(c['action'])}</td><td>{c['lost_work_s']:.1f}</td><td>{c['downtime_s']:.1f}</td></tr>"
        for c in good["incidents"]
    )
    html = (
        f"<p>ETTR <b>{good['ettr']:.1%}</b>: {good['productive_s']:.1f} s productive of "
        f"{wall:.1f} s wall clock; "
        f"steps kept {good['steps_kept']}, thrown away {good['steps_lost']}</p>"
        f'<svg width="{WIDTH}" height="22" role="img" aria-label="goodput">{bar}</svg>'
        f"<table><tr><th>bucket</th><th>seconds</th><th>share</th></tr>{rows}</table>"
    )
    if costs:
        html += (
            "<h3>what each attempt-stopping incident "
            "cost</h3><table><tr><th>incident</th><th>what</th>"
            f"<th>action</th><th>lost work s</th><th>downtime s</th></tr>{costs}</table>"
        )
    return html


def _summary(data: dict[str, Any]) -> str:
    good = data.get("goodput") or {}
    attempts = data["attempts"]
    actions: dict[str, int] = {}
    for d in data["decisions"]:
        actions[d["action"]] = actions.get(d["action"], 0) + 1
    only = data.get("only_attempt")
    rows = [
        ("attempt", f"{only} (this page; faultlens report without --attempt shows every one)")
        if only is not None
        else ("attempts", str(len(attempts))),
        ("incidents", str(len(data["incidents"]))),
        ("decisions", ", ".join(f"{n} {a}" for a, n in sorted(actions.items())) or "-"),
        ("ETTR", "-" if not good else f"{good['ettr']:.1%} (the whole job)"),
        (
            "window",
            "-"
            if not good
            else f"{good['start']} .. {good['end']} ({seconds_text(good['wall_s'])})",
        ),
    ]
    html = (
        '<div class="kv">'
        + "".join(f"<b>{_e(k)}</b><span>{_e(v)}</span>" for k, v in rows)
        + "</div>"
    )
    if data["incidents"]:
        nodes_of = {a["attempt"]: a.get("nodes") or [] for a in attempts}
        acted = {d["incident_id"]: d["action"] for d in data["decisions"]}
        body = "".join(
            f'<tr><td>{_e(i.get("attempt") or 0)}</td><td class="id">{_e(i["incident_id"])}</td>'
            f"<td>{_e(i['class'])} / {_e(i['cause'])}</td>"
            f'<td class="culprit">{_e(_where(_short_gpus(i), nodes_of))}</td>'
            f"<td>{_e(acted.get(i['incident_id'], '-'))}</td></tr>"
            for i in data["incidents"]
        )
        html += (
            '<table class="incidents"><tr><th>attempt</th><th>incident</th><th>what</th>'
            f"<th>culprit</th><th>decision</th></tr>{body}</table>"
        )
    return html


VERDICT_LINES = 3  # incidents named in the verdict; the summary's table lists every one
GPU_SHOWN = 12  # characters of a GPU's UUID in the verdict and the summary (GPU-1a2b3c4d...)


def _short_gpus(incident: dict[str, Any]) -> dict[str, Any]:
    """The incident with its GPUs' UUIDs cut to their first characters (whole in the sections
    below): a 40-character UUID must not push the node and rank out of a line."""
    gpus = [
        g if len(str(g)) <= GPU_SHOWN + 2 else f"{str(g)[:GPU_SHOWN]}\u2026"
        for g in incident.get("culprit_gpus") or ()
    ]
    return {**incident, "culprit_gpus": gpus}


def _verdict(data: dict[str, Any]) -> str:
    """What the page says first, above everything else: each incident's culprit (node and rank),
    what it was and what was decided; with no incident, that nobody is named."""
    incidents = data["incidents"]
    if not incidents:
        return (
            '<div id="verdict" class="ok"><p>No incident: no node, rank or GPU is named '
            "in this job"
            + ("" if data.get("only_attempt") is None else " attempt")
            + ".</p></div>"
        )
    nodes_of = {a["attempt"]: a.get("nodes") or [] for a in data["attempts"]}
    acted = {d["incident_id"]: d["action"] for d in data["decisions"]}
    lines = []
    for incident in incidents[:VERDICT_LINES]:
        action = acted.get(incident["incident_id"])
        lines.append(
            f'<p><span class="culprit">{_e(_where(_short_gpus(incident), nodes_of))}</span> '
            f'<span class="what">&mdash; {_e(incident["class"])} / {_e(incident["cause"])}'
            + (f" &rarr; {_e(action)}" if action else ", no decision")
            + f" (attempt {_e(incident.get('attempt') or 0)})</span></p>"
        )
    if len(incidents) > VERDICT_LINES:
        lines.append(
            f'<p class="more muted">and {len(incidents) - VERDICT_LINES} more incident(s): '
            "the summary below lists every one</p>"
        )
    return '<div id="verdict">' + "".join(lines) + "</div>"


def render_html(data: dict[str, Any]) -> str:
    """The page for one job's data (faultlens.controller.report.data.job_data)."""
    bodies = {
        "summary": ("Summary", _summary(data)),
        "timeline": ("Attempts and incidents", _timeline(data)),
        "heatmap": ("Each rank's own work by step", _heatmap(data)),
        "gpu": ("GPU signals around each incident", _gpu(data)),
        "decisions": ("Decisions and their evidence", _decisions(data)),
        "goodput": ("Goodput", _goodput(data)),
    }
    sections = "".join(
        f'<section id="{key}"><h2>{_e(title)}</h2>{body}</section>'
        for key, (title, body) in bodies.items()
    )
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    only = data.get("only_attempt")
    scope = "" if only is None else f", attempt {only}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>faultlens report: {_e(data['job_id'])}{scope}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style></head><body><h1>faultlens report: job {_e(data['job_id'])}"
        f"{scope}</h1>{_verdict(data)}"
        f'<p class="muted">generated {generated}; self-contained (no network needed)</p><nav '
        'id="nav"></nav>'
        f"{sections}<script>{SCRIPT}</script></body></html>\n"
    )


def write_report(store: Store, job_id: str, path: Path, *, attempt: int | None = None) -> Path:
    """Write the job's page (one attempt's, when `attempt` is given) to `path` (atomically: a
    temporary file renamed into place)."""
    html = render_html(job_data(store, job_id, attempt=attempt))
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    return path.resolve()


def report_json(store: Store, job_id: str) -> str:  # pragma: no cover - a debugging aid
    return json.dumps(job_data(store, job_id), default=str, indent=1)
