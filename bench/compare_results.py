"""Two runs of `python -m bench.run_all` side by side: what changed in result, and by how much each
figure moved.

    python -m bench.compare_results BEFORE AFTER [--out FILE.md]

BEFORE and AFTER: a bench/out/results.json, or a published docs/benchmarks.md (its tables read back
by section title, bench/common.py `parse_document`). Two results.json are compared leaf by leaf: a
flag, text or count that differs is a change in result (listed first); a measured figure (a float)
is shown as after/before. Machine facts, times of day and paths are left out. Where either side is
a published file, both are compared as published figures: a raw result goes through its benchmark's
figures first (bench/run_all.py), then each figure's value cell is compared, a number with a
fraction or a unit as a measured figure, anything else as a result.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench.common import parse_document
from bench.run_all import BENCHMARKS, Benchmark

IGNORED = re.compile(r"(^|\.)(machine|_seconds|_commit|_date|_published|generated_at|started_at|"
                     r"store|path|cache|tree|load_average\w*)(\.|$)")
#: the marker of a result read back from a published file: {"_published": True, "figures": {...}}
PUBLISHED = "_published"


def load(path: Path) -> dict[str, dict[str, Any]]:
    """Benchmark key -> result: raw from a results.json, its published figures (figure -> value
    cell) from a benchmarks.md."""
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    by_title = {b.title: b.key for b in BENCHMARKS}
    found: dict[str, dict[str, Any]] = {}
    for section in parse_document(text)[1]:
        key = by_title.get(section.title)
        if key is not None and key not in found:
            found[key] = {PUBLISHED: True, "figures": _figure_cells(section.figures)}
    return found


def _figure_cells(figures: Any) -> dict[str, str]:
    cells: dict[str, str] = {}
    for figure in figures:
        label, n = figure.figure, 2
        while label in cells:  # one figure measured against two anchors
            label, n = f"{figure.figure} ({n})", n + 1
        cells[label] = figure.value
    return cells


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(leaves(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for index, item in enumerate(value):
            out.update(leaves(item, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


MEASURED = re.compile(r"(per_s|per_cpu_s|per_second|_s$|_ms$|_us$|_mb$|_kib$|seconds|bytes|rss|"
                      r"ratio|speedup|_x$)")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _measured(key: str, x: Any, y: Any) -> bool:
    """A measured figure, compared by ratio: two numbers, one a float or the field a rate, time,
    size or ratio (an integer count that is not, like incidents or failovers, is a result)."""
    return _number(x) and _number(y) and (isinstance(x, float) or isinstance(y, float)
                                           or bool(MEASURED.search(key.rsplit(".", 1)[-1])))


def _shown(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(changes in result, moved figures) as markdown table rows, of two raw results."""
    old, new = leaves(before), leaves(after)
    changes, figures = [], []
    for key in sorted(set(old) | set(new)):
        if IGNORED.search(key):
            continue
        a, b = old.get(key, "(absent)"), new.get(key, "(absent)")
        if _measured(key, a, b):
            ratio = f"{b / a:.2f}" if a else "-"  # type: ignore[operator]
            figures.append(f"| {key} | {_shown(a)} | {_shown(b)} | {ratio} |")
        elif a != b:
            changes.append(f"| {key} | {json.dumps(a, default=str)[:80]} | "
                           f"{json.dumps(b, default=str)[:80]} |")
    return changes, figures


#: a value cell's leading number, and what follows it
LEADING = re.compile(r"^(?P<number>-?[\d,]*\d(?:\.\d+)?)(?P<rest>.*)$")
#: the units a published figure's number may carry (and any rate, `.../s`)
UNITS = frozenset({"s", "ms", "µs", "us", "min", "h", "MB", "GB", "MiB", "GiB", "KB", "KiB", "x",
                   "%", "rows", "GPUs"})


def figure_value(cell: str) -> float | None:
    """The measured number of a published value cell: its leading number where the cell is a figure
    (the number has a fraction, or a unit follows it: `2.47 s (3.79 s CPU)`, `0.92`, `674 MB`), else
    None (a count, a flag or a text: `0`, `72/72`, `2 of 2`, `yes`), which compares as a result."""
    match = LEADING.match(cell.strip())
    if match is None:
        return None
    number, rest = match["number"].replace(",", ""), match["rest"].strip()
    unit = rest.split(" ", 1)[0].rstrip(",;)") if rest else ""
    if "." not in number and unit not in UNITS and not unit.endswith("/s"):
        return None
    return float(number)


def compare_figures(before: dict[str, str], after: dict[str, str]) -> tuple[list[str], list[str]]:
    """(changes in result, moved figures) as markdown table rows, of two published figure tables."""
    changes, figures = [], []
    for label in list(before) + [k for k in after if k not in before]:
        a, b = before.get(label, "(absent)"), after.get(label, "(absent)")
        x, y = figure_value(a), figure_value(b)
        if x is not None and y is not None:
            ratio = f"{y / x:.2f}" if x else "-"
            figures.append(f"| {label} | {a} | {b} | {ratio} |")
        elif a != b:
            changes.append(f"| {label} | {a} | {b} |")
    return changes, figures


def published(bench: Benchmark, result: dict[str, Any]) -> dict[str, str]:
    """A result's published figures (figure -> value cell), whether read back or raw."""
    if result.get(PUBLISHED):
        return dict(result["figures"])
    return _figure_cells(bench.figures(result))


def report(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    lines = []
    for bench in BENCHMARKS:
        a, b = before.get(bench.key), after.get(bench.key)
        if a is None and b is None:
            continue
        lines += [f"## {bench.key}: {bench.title}", ""]
        if a is None or b is None or "error" in a or "error" in b:
            lines += [f"not compared: before {'absent' if a is None else a.get('error', 'ok')}, "
                      f"after {'absent' if b is None else b.get('error', 'ok')}", ""]
            continue
        if a.get(PUBLISHED) or b.get(PUBLISHED):
            changes, figures = compare_figures(published(bench, a), published(bench, b))
        else:
            changes, figures = compare(a, b)
        lines += ["Changes in result:" if changes
                  else "No change in result (flags, texts, counts).", ""]
        if changes:
            lines += ["| field | before | after |", "|---|---|---|", *changes, ""]
        if figures:
            lines += ["| figure | before | after | after/before |", "|---|---|---|---|", *figures,
                      ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = report(load(args.before), load(args.after))
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
