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
    "detection": "#f4c430",
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
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1000px;
color:#1d2430;padding:0 12px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2e8;
padding-bottom:4px}h3{font-size:14px;margin:16px 0 4px}
.muted{color:#5b6675}.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #dde2e8;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f3f5f8}svg{display:block;margin:6px 0}.legend span{display:inline-block;
margin-right:12px}.sw{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;white-space:pre-wrap;word-break:break-word}
.tag{display:inline-block;border-radius:3px;padding:0 5px;color:#fff;font-size:12px}
.failover{background:#2e9e5b}.escalate{background:#d7263d}.other{background:#5b6675}
"""

SCRIPT = """
(function(){
  var sections = document.querySelectorAll('section[id]');
  var nav = document.getElementById('nav');
  sections.forEach(function(s){
    var a = document.createElement('a'); a.href = '#' + s.id; a.textContent = s.querySelector('h2').textContent;
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
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 4}" stroke="#5b6675"/>'
                         f'<text x="{x:.1f}" y="{y + 16}" font-size="11" text-anchor="middle" '
                         'fill="#5b6675">'
                         f'+{seconds_text(seconds)}</text>')
        return "".join(parts)


def _timeline(data: dict[str, Any]) -> str:
    good = data.get("goodput") or {}
    attempts = data["attempts"]
    starts = [_t(a["start"]) for a in attempts] + [_t(good.get("start"))]
    ends = [_t(a["end"]) for a in attempts] + [_t(good.get("end"))]
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
        parts.append(f'<text x="0" y="{y + 13}" font-size="12">{_e(label)}</text>'
                     f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="18" '
                     'fill="#c9d6e8" '
                     f'stroke="#7f95b3"><title>{_e(label)} on '
                     f'{_e(", ".join(attempt["nodes"] or []))}</title></rect>'
                     f'<text x="{x0 + 4:.1f}" y="{y + 13}" '
                     f'font-size="11">{_e(", ".join(attempt["nodes"] or []))}'
                     '</text>')
    rows_of = {a["attempt"]: n for n, a in enumerate(attempts, 1)}
    for incident in data["incidents"]:
        y = 18 + 26 * rows_of.get(incident.get("attempt") or 0, 1)
        x0, x1 = (
            axis.x(_t(incident.get("first_signal_ts"))),
            axis.x(_t(incident.get("detected_ts"))),
        )
        tip = f"{incident['class']} / {incident['cause']}: {incident.get('summary') or ''}"
        parts.append(f'<line x1="{x0:.1f}" x2="{x1:.1f}" y1="{y + 9}" y2="{y + 9}" '
                     'stroke="#d7263d" '
                     f'stroke-width="3"/><path d="M{x1:.1f},{y - 2} l6,11 l-12,0 z" fill="#d7263d">'
                     f'<title>{_e(tip)}</title></path>')
    for decision in data["decisions"]:
        y = 18 + 26 * rows_of.get(decision.get("attempt") or 0, 1)
        x = axis.x(_t(decision.get("issued_ts")))
        color = "#2e9e5b" if decision["action"] == "failover" else "#d7263d"
        parts.append(f'<path d="M{x:.1f},{y + 9} l6,6 l-6,6 l-6,-6 z" fill="{color}" stroke="#fff">'
                     f'<title>decision: {_e(decision["action"])} '
                     f'({_e(decision.get("policy_rule"))})</title></path>')
    parts.append(axis.ticks(18 + 26 * rows + 4))
    parts.append("</svg>")
    legend = "".join(f'<span><i class="sw" style="background:{c}"></i>{_e(b)}</span>' for b, c in
                     BUCKET_COLORS.items())
    legend += ('<span><i class="sw" style="background:#d7263d"></i>incident (first signal to '
               'detection)</span>'
               '<span>&#9670; decision</span>')
    return "".join(parts) + f'<div class="legend muted">{legend}</div>'


def _heat_color(ratio: float) -> str:
    if ratio != ratio:  # NaN
        return "#eeeeee"
    if ratio <= 1.0:
        level = max(0.0, min(1.0, (1.0 - ratio) / 0.5))
        r, g, b = 235 - int(60 * level), 242 - int(40 * level), 250
    else:
        level = max(0.0, min(1.0, (ratio - 1.0) / 1.0))
        r, g, b = 255, int(235 - 190 * level), int(200 - 170 * level)
    return f"#{r:02x}{g:02x}{b:02x}"


def _heatmap(data: dict[str, Any]) -> str:
    grid = data["steps"]
    cells = grid["cells"]
    if not cells:
        return ('<p class="muted">no step timings for this job '
                '(faultlens.collectors.training.step_timer writes '
                'them)</p>')
    out = ['<p class="muted">mean step time of each rank at each step, relative to the attempt\'s '
           'median '
           '(white: the median; red: slower, 2x and more darkest; blue: faster)'
           + (f"; {grid['step_bucket']} steps per column" if grid["step_bucket"] > 1 else "")
           + (f"; {grid['rank_bucket']} ranks per row" if grid["rank_bucket"] > 1 else "") + '</p>']
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for cell in cells:
        by_attempt.setdefault(cell["attempt"], []).append(cell)
    for attempt, mine in sorted(by_attempt.items()):
        steps = sorted({c["step"] for c in mine})
        ranks = sorted({c["rank"] for c in mine})
        median = statistics.median(c["seconds"] for c in mine if c["seconds"] is not None) or 1e-9
        cw = max(2.0, min(28.0, (WIDTH - 80) / max(len(steps), 1)))
        ch = max(3.0, min(16.0, 260 / max(len(ranks), 1)))
        sx = {s: i for i, s in enumerate(steps)}
        ry = {r: i for i, r in enumerate(ranks)}
        height = ch * len(ranks) + 34
        parts = [f'<h3>attempt {attempt}: steps {steps[0]}..{steps[-1]}, median {median:.3f} s</h3>'
                 f'<svg width="{80 + cw * len(steps) + 10:.0f}" height="{height:.0f}" role="img" '
                 f'aria-label="step time heatmap, attempt {attempt}">']
        for r in ranks:
            if len(ranks) <= 32 or r == ranks[0] or r == ranks[-1]:
                parts.append(f'<text x="0" y="{ry[r] * ch + ch - 1:.1f}" '
                             f'font-size="{min(11, ch + 2):.0f}">'
                             f'rank {r}</text>')
        for c in mine:
            seconds = c["seconds"]
            ratio = float("nan") if seconds is None else seconds / median
            parts.append(
                f'<rect x="{80 + sx[c["step"]] * cw:.1f}" y="{ry[c["rank"]] * ch:.1f}" '
                f'width="{cw:.1f}" '
                f'height="{ch:.1f}" fill="{_heat_color(ratio)}"><title>rank {c["rank"]} '
                f"step {c['step']}: "
                f"{'-' if seconds is None else f'{seconds:.3f} s ({ratio:.2f}x median)'}</title></rect>"
            )
        y = ch * len(ranks) + 14
        if cw * len(steps) < 120:
            parts.append("</svg>")
            out.append("".join(parts))
            continue
        parts.append(f'<text x="80" y="{y:.0f}" font-size="11" fill="#5b6675">step '
                     f'{steps[0]}</text>'
                     f'<text x="{80 + cw * len(steps):.0f}" y="{y:.0f}" font-size="11" '
                     'fill="#5b6675" '
                     f'text-anchor="end">step {steps[-1]}</text></svg>')
        out.append("".join(parts))
    return "".join(out)


def _line_chart(
    samples: list[dict[str, Any]],
    metric: str,
    label: str,
    lo: dt.datetime,
    hi: dt.datetime,
    marks: list[tuple[dt.datetime | None, str]],
) -> str:
    series: dict[str, list[tuple[dt.datetime, float]]] = {}
    for s in samples:
        value = s.get(metric)
        if value is None or value != value:
            continue
        key = (f"{s['node']} GPU "
               f"{s['gpu_index'] if s['gpu_index'] is not None else s.get('gpu_uuid') or '?'}")
        series.setdefault(key, []).append((_t(s["ts"]), float(value)))
    if not series:
        return ""
    keys = sorted(series)[:MAX_SERIES]
    values = [v for k in keys for _, v in series[k]]
    vmin, vmax = min(values), max(values)
    if vmax - vmin < 1e-9:
        vmin, vmax = vmin - 1, vmax + 1
    w, h, left = 440, 120, 46
    axis = _Axis(lo, hi, left, w - 6)

    def y(v: float) -> float:
        return 8 + (h - 30) * (1 - (v - vmin) / (vmax - vmin))

    palette = [
        "#1f77b4",
        "#d62728",
        "#2ca02c",
        "#ff7f0e",
        "#9467bd",
        "#8c564b",
        "#e377c2",
        "#7f7f7f",
    ]
    parts = [f'<svg width="{w}" height="{h}" role="img" aria-label="{_e(label)}"><text x="{left}" '
             f'y="{h - 4}" '
             f'font-size="11" fill="#5b6675">{_e(label)}: {vmin:.0f}..{vmax:.0f}</text>'
             f'<rect x="{left}" y="8" width="{w - 6 - left}" height="{h - 30}" fill="none" '
             'stroke="#dde2e8"/>']
    for when, text in marks:
        if when is not None:
            x = axis.x(when)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="8" y2="{h - 22}" stroke="#d7263d" '
                         f'stroke-dasharray="3,2"><title>{_e(text)}</title></line>')
    for i, key in enumerate(keys):
        points = " ".join(f"{axis.x(t):.1f},{y(v):.1f}" for t, v in series[key])
        parts.append(f'<polyline fill="none" stroke="{palette[i % len(palette)]}" '
                     'stroke-width="1.5" '
                     f'points="{points}"><title>{_e(key)}</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)


def _gpu(data: dict[str, Any]) -> str:
    if not data["incidents"]:
        return '<p class="muted">no incidents</p>'
    out = []
    for around, incident in zip(data["gpu_around"], data["incidents"], strict=True):
        out.append(f'<h3>{_e(incident["incident_id"])}: {_e(incident["class"])} / '
                   f'{_e(incident["cause"])} on '
                   f'{_e(", ".join(around["nodes"]) or "-")}</h3>')
        if not around["samples"] and not around["events"]:
            out.append('<p class="muted">no GPU samples or events on these nodes around the '
                       'incident</p>')
            continue
        lo, hi = _t(around["from"]), _t(around["to"])
        marks = [
            (_t(incident.get("first_signal_ts")), "first signal"),
            (_t(incident.get("detected_ts")), "detected"),
        ]
        sources = sorted({str(s.get("source")) for s in around["samples"] if s.get("source")})
        if sources:
            note = (" (a recorded or simulated GPU backend, not a live NVML reading)"
                    if set(sources) & {"recorded", "simulated", "sim"} else "")
            out.append(f'<p class="muted">sample source: {_e(", ".join(sources))}{note}; dashed '
                       'lines: first signal '
                       'and detection</p>')
        charts = [
            _line_chart(around["samples"], m, label, lo, hi, marks) for m, label in GPU_METRICS
        ]
        out.append(
            '<div style="display:flex;flex-wrap:wrap;gap:8px">'
            + "".join(c for c in charts if c)
            + "</div>"
        )
        if around["events"]:
            rows = "".join(
                f"<tr><td>{_e(_t(e['ts']).strftime('%H:%M:%S.%f')[:-3])}</td><td>{_e(e['node'])}</td>"
                f"<td>{_e(e['gpu_index'])}</td><td>{_e(e['kind'])}</td><td>{_e(e['code'])}</td>"
                f'<td class="mono">{_e(e["message"])}</td></tr>'
                for e in around["events"]
            )
            out.append("<table><tr><th>time</th><th>node</th><th>GPU</th><th>kind</th><th>code</th>"
                       f"<th>message</th></tr>{rows}</table>")
    return "".join(out)


def _decisions(data: dict[str, Any]) -> str:
    incidents = {i["incident_id"]: i for i in data["incidents"]}
    if not data["decisions"] and not data["incidents"]:
        return '<p class="muted">no incidents, no decisions</p>'
    out = []
    decided = set()
    for decision in data["decisions"]:
        incident = incidents.get(decision["incident_id"], {})
        decided.add(decision["incident_id"])
        tag = decision["action"] if decision["action"] in ("failover", "escalate") else "other"
        restore = ("-" if decision.get("restore_step") is None
                   else restore_text(decision["restore_step"], decision.get("restore_tier")))
        out.append(f'<h3><span class="tag {tag}">{_e(decision["action"])}</span> '
                   f'{_e(decision["incident_id"])} '
                   f'(attempt {_e(decision.get("attempt"))})</h3>')
        out.append(
            _incident_kv(incident) + '<div class="kv">'
            f"<b>policy rule</b><span>{_e(decision.get('policy_rule'))}</span>"
            f"<b>reason</b><span>{_e(decision.get('reason'))}</span>"
            f"<b>exclude</b><span>{_e(', '.join(decision.get('exclude_nodes') or []) or '-')}</span>"
            f"<b>restore</b><span>{_e(restore)}</span></div>"
        )
        out.append(_evidence(incident))
    for incident_id, incident in incidents.items():
        if incident_id not in decided:
            out.append(f'<h3><span class="tag other">no decision</span> {_e(incident_id)}</h3>'
                       + _incident_kv(incident) + _evidence(incident))
    return "".join(out)


def _incident_kv(incident: dict[str, Any]) -> str:
    if not incident:
        return ""
    culprit = culprit_text(incident.get("culprit_nodes"), incident.get("culprit_ranks"),
                           incident.get("culprit_gpus"), incident.get("cause"))
    return ('<div class="kv">'
            f'<b>what</b><span>{_e(incident.get("class"))} / {_e(incident.get("cause"))}: '
            f'{_e(incident.get("summary"))}</span><b>where</b><span>{_e(culprit)}</span>'
            f'<b>rule</b><span>{_e(incident.get("rule"))}, confidence '
            f'{incident.get("confidence") or 0:.2f}</span>'
            "</div>")


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
        rows.append(f"<tr><td>{_e(offset)}</td><td>{_e(item['table'])}</td>"
                    f"<td class=\"mono\">{_e(item['text'])}</td></tr>")
    return (
        "<table><tr><th>time</th><th>table</th><th>evidence</th></tr>" + "".join(rows) + "</table>"
    )


def _goodput(data: dict[str, Any]) -> str:
    good = data.get("goodput")
    if not good:
        return '<p class="muted">no goodput accounting for this job (no attempts with times)</p>'
    wall = good["wall_s"] or 1e-9
    buckets = {"productive": good["productive_s"], **good["badput_s"]}
    bar = "".join(f'<rect x="{sum(list(buckets.values())[:i]) / wall * WIDTH:.1f}" y="0" '
                  f'width="{v / wall * WIDTH:.1f}" height="22" '
                  f'fill="{BUCKET_COLORS.get(k, "#999")}"><title>{_e(k)} '
                  f'{v:.1f} s</title></rect>' for i, (k, v) in enumerate(buckets.items()))
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
    html = (f'<p>ETTR <b>{good["ettr"]:.1%}</b>: {good["productive_s"]:.1f} s productive of '
            f'{wall:.1f} s wall clock; '
            f'steps kept {good["steps_kept"]}, thrown away {good["steps_lost"]}</p>'
            f'<svg width="{WIDTH}" height="22" role="img" aria-label="goodput">{bar}</svg>'
            f"<table><tr><th>bucket</th><th>seconds</th><th>share</th></tr>{rows}</table>")
    if costs:
        html += ("<h3>what each attempt-stopping incident "
                 "cost</h3><table><tr><th>incident</th><th>what</th>"
                 f"<th>action</th><th>lost work s</th><th>downtime s</th></tr>{costs}</table>")
    return html


def _summary(data: dict[str, Any]) -> str:
    good = data.get("goodput") or {}
    attempts = data["attempts"]
    actions: dict[str, int] = {}
    for d in data["decisions"]:
        actions[d["action"]] = actions.get(d["action"], 0) + 1
    rows = [("attempts", str(len(attempts))), ("incidents", str(len(data["incidents"]))),
            ("decisions", ", ".join(f"{n} {a}" for a, n in sorted(actions.items())) or "-"),
            ("ETTR", "-" if not good else f"{good['ettr']:.1%}"),
            ("window", "-" if not good else f"{good['start']} .. {good['end']} "
                                            f"({seconds_text(good['wall_s'])})")]
    return (
        '<div class="kv">'
        + "".join(f"<b>{_e(k)}</b><span>{_e(v)}</span>" for k, v in rows)
        + "</div>"
    )


def render_html(data: dict[str, Any]) -> str:
    """The page for one job's data (faultlens.controller.report.data.job_data)."""
    bodies = {
        "summary": ("Summary", _summary(data)),
        "timeline": ("Attempts and incidents", _timeline(data)),
        "heatmap": ("Step time by rank and step", _heatmap(data)),
        "gpu": ("GPU signals around each incident", _gpu(data)),
        "decisions": ("Decisions and their evidence", _decisions(data)),
        "goodput": ("Goodput", _goodput(data)),
    }
    sections = "".join(f'<section id="{key}"><h2>{_e(title)}</h2>{body}</section>'
                       for key, (title, body) in bodies.items())
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>faultlens report: {_e(data['job_id'])}</title>"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<style>{CSS}</style></head><body><h1>faultlens report: job {_e(data['job_id'])}</h1>"
            f'<p class="muted">generated {generated}; self-contained (no network needed)</p><nav '
            'id="nav"></nav>'
            f"{sections}<script>{SCRIPT}</script></body></html>\n")


def write_report(store: Store, job_id: str, path: Path) -> Path:
    """Write the job's page to `path` (atomically: a temporary file renamed into place)."""
    html = render_html(job_data(store, job_id))
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    return path.resolve()


def report_json(store: Store, job_id: str) -> str:  # pragma: no cover - a debugging aid
    return json.dumps(job_data(store, job_id), default=str, indent=1)
