"""Two runs of `python -m bench.run_all` side by side: what changed in result, and by how much each figure moved.

    python -m bench.compare_results BEFORE AFTER [--out FILE.md]

BEFORE and AFTER: a bench/out/results.json, or a benchmarks.md that run_all wrote (its raw-result blocks are read
back by section title). Every leaf of each benchmark's result is compared: a flag, text or count that differs is
a change in result (listed first); a measured figure (a float) is shown as after/before. Machine facts, times of
day and paths are left out.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench.run_all import BENCHMARKS

IGNORED = re.compile(r"(^|\.)(machine|_seconds|generated_at|started_at|store|path|cache|tree|load_average\w*)(\.|$)")
RAW = re.compile(r"^## (?P<title>.+?)\n.*?<summary>raw result</summary>\s*```json\n(?P<json>.*?)\n```",
                 re.DOTALL | re.MULTILINE)


def load(path: Path) -> dict[str, dict[str, Any]]:
    """Benchmark key -> raw result, from results.json or a run_all benchmarks.md."""
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    by_title = {b.title: b.key for b in BENCHMARKS}
    found: dict[str, dict[str, Any]] = {}
    for section in re.split(r"(?m)^(?=## )", text):
        match = RAW.match(section)
        if match and match["title"] in by_title and by_title[match["title"]] not in found:
            found[by_title[match["title"]]] = json.loads(match["json"])
    return found


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


MEASURED = re.compile(r"(per_s|per_cpu_s|per_second|_s$|_ms$|_us$|_mb$|_kib$|seconds|bytes|rss|ratio|speedup|_x$)")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _measured(key: str, x: Any, y: Any) -> bool:
    """A measured figure, compared by ratio: two numbers, one a float or the field a rate, time, size or ratio
    (an integer count that is not, like incidents or failovers, is a result)."""
    return _number(x) and _number(y) and (isinstance(x, float) or isinstance(y, float)
                                           or bool(MEASURED.search(key.rsplit(".", 1)[-1])))


def _shown(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(changes in result, moved figures) as markdown table rows."""
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
            changes.append(f"| {key} | {json.dumps(a, default=str)[:80]} | {json.dumps(b, default=str)[:80]} |")
    return changes, figures


def report(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    lines = []
    for bench in BENCHMARKS:
        a, b = before.get(bench.key), after.get(bench.key)
        if a is None and b is None:
            continue
        lines += [f"## {bench.key}: {bench.title}", ""]
        if a is None or b is None or "error" in a or "error" in b:
            lines += [f"not compared: before {'absent' if a is None else a.get('error', 'ok')}, after "
                      f"{'absent' if b is None else b.get('error', 'ok')}", ""]
            continue
        changes, figures = compare(a, b)
        lines += ["Changes in result:" if changes else "No change in result (flags, texts, counts).", ""]
        if changes:
            lines += ["| field | before | after |", "|---|---|---|", *changes, ""]
        if figures:
            lines += ["| figure | before | after | after/before |", "|---|---|---|---|", *figures, ""]
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
