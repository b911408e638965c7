"""Small helpers shared by the benchmarks: timing, peak memory, machine description, result
printing, and the one form every benchmark's published result takes in docs/benchmarks.md
(`Figure`, `Section`, `render_section`).

docs/benchmarks.md holds results only: per benchmark one section, per section one table of
figures, the newest measurement of each. Every writer (bench/run_all.py for the benchmarks it
runs, bench/bench_campaign.py for the campaign) renders its section with `render_section` and puts
it in place with `write_section`, which keeps every other section as it is; `parse_document` reads
the file back (bench/compare_results.py, the tests), so the file always has the shape this module
writes. How a figure moved, and why, is told in docs/history.md, not there.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float


def timed(fn: Callable[[], Any]) -> tuple[Any, Timing]:
    """Run fn once; wall and process CPU seconds."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = fn()
    return result, Timing(time.perf_counter() - wall0, time.process_time() - cpu0)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                cpu,
            )
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def emit(name: str, result: dict[str, Any]) -> None:
    """Print one benchmark's result as a JSON line (collected by bench/run_all.py)."""
    print(json.dumps({"benchmark": name, **result}, default=str))


# --- the published form (docs/benchmarks.md) ---------------------------------------------

#: the columns of every benchmark's table, in order
COLUMNS = ("figure", "value", "target", "anchor (same run)", "ratio", "commit", "date")
#: prose is wrapped at this width (table rows and commands are not wrapped)
WIDTH = 100
#: an empty cell
NONE = "-"

_HEADER_PARAGRAPHS = (
    "Results only: one section per benchmark, one table per section, the newest measurement of "
    "each figure. How the figures moved and why (the fixes, the reruns, the machines): "
    "[history.md](history.md).",
    "The file is written by the benchmarks: `python -m bench.run_all [--only KEY,...]` rewrites "
    "the sections of the benchmarks it runs and keeps the others, bench/bench_campaign.py writes "
    "its own, and every section has the one shape of bench/common.py `render_section` "
    "(tests/test_bench_compare.py checks this file against it). Two published results side by "
    "side: `python -m bench.compare_results BEFORE AFTER` (docs/benchmarks-rerun.md is one such "
    "comparison).",
    "Columns: **figure** what was measured; **value** faultlens' figure; **target** what the "
    "figure answers to; **anchor (same run)** what faultlens is compared with, measured in the "
    "same run (torch's analyzer, NVIDIA's, pandas, a plain torchrun, the engine before); "
    "**ratio** the anchor's cost over faultlens' (for a rate, faultlens' over the anchor's): "
    "above 1 faultlens is ahead; **commit** the code measured where the run names it, else the "
    "commit that published the figure; **date** of the measurement (UTC); `-` none. Speed targets "
    "are measured here, never asserted in tests; the commands under each heading reproduce its "
    "figures.",
)


@dataclass(frozen=True)
class Figure:
    """One published figure: what was measured, faultlens' value, the target it answers to, the
    anchor measured in the same run and the ratio between them, and which code measured it when.
    Every cell is text: the writer formats its numbers once; a reader (compare_results) takes the
    leading number back."""

    figure: str
    value: str
    target: str = NONE
    anchor: str = NONE
    ratio: str = NONE
    commit: str = NONE
    date: str = NONE

    def cells(self) -> tuple[str, ...]:
        return (self.figure, self.value, self.target, self.anchor, self.ratio, self.commit,
                self.date)


@dataclass(frozen=True)
class Section:
    """One benchmark's published result: its title (the `## ` heading, by which writers and
    readers find it), what it compares, the commands that reproduce it, its table, and notes that
    qualify the figures (the run's conditions, what a figure does not show). No story: that is
    docs/history.md's."""

    title: str
    compares: str
    commands: tuple[str, ...]
    figures: tuple[Figure, ...]
    notes: tuple[str, ...] = ()


def _prose(text: str, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(" ".join(text.split()), width=WIDTH, initial_indent=first,
                         subsequent_indent=rest, break_long_words=False, break_on_hyphens=False)


#: the top of docs/benchmarks.md, above the sections
DOC_HEADER = "\n\n".join(["# Benchmarks", *("\n".join(_prose(p)) for p in _HEADER_PARAGRAPHS)])


def _cell(text: str) -> str:
    return (" ".join(str(text).split()) or NONE).replace("|", "\\|")


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render_section(section: Section) -> str:
    """The section as docs/benchmarks.md holds it (no trailing newline): the heading, what it
    compares, the commands (indented four spaces), the table, the notes as a list."""
    if not section.figures:
        raise ValueError(f"{section.title}: a section publishes at least one figure")
    lines = [f"## {section.title}", "", *_prose(section.compares), ""]
    lines += [f"    {command}" for command in section.commands]
    lines += ["", _row(COLUMNS), "|" + "---|" * len(COLUMNS)]
    lines += [_row(figure.cells()) for figure in section.figures]
    if section.notes:
        lines.append("")
        for note in section.notes:
            lines += _prose(note, "- ", "  ")
    return "\n".join(lines)


_UNESCAPED_BAR = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    inner = line.strip()
    if not (inner.startswith("|") and inner.endswith("|")):
        raise ValueError(f"not a table row: {line!r}")
    return [cell.strip().replace("\\|", "|") for cell in _UNESCAPED_BAR.split(inner[1:-1])]


def _blocks(lines: list[str]) -> list[list[str]]:
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line:
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [block for block in blocks if block]


def parse_section(text: str) -> Section:
    """The Section a `render_section` text holds; ValueError naming what is not in its shape."""
    heading, *rest = text.strip("\n").split("\n")
    if not heading.startswith("## "):
        raise ValueError(f"a section starts with '## ', not {heading!r}")
    title, blocks = heading[3:], _blocks(rest)
    if len(blocks) < 3:
        raise ValueError(f"{title}: expected what it compares, its commands and its table")
    compares, commands, table, *notes = blocks
    if not all(line.startswith("    ") for line in commands):
        raise ValueError(f"{title}: the commands are indented by four spaces")
    if len(table) < 3 or tuple(_cells(table[0])) != COLUMNS:
        raise ValueError(f"{title}: a table with the columns {COLUMNS} and at least one row")
    figures = []
    for line in table[2:]:
        cells = _cells(line)
        if len(cells) != len(COLUMNS):
            raise ValueError(f"{title}: {len(cells)} cells, not {len(COLUMNS)}: {line!r}")
        figures.append(Figure(*cells))
    items: list[str] = []
    for line in (line for block in notes for line in block):
        if line.startswith("- "):
            items.append(line[2:])
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
        else:
            raise ValueError(f"{title}: after the table, only a list of notes: {line!r}")
    return Section(title, " ".join(compares), tuple(c[4:] for c in commands), tuple(figures),
                   tuple(items))


def parse_document(text: str) -> tuple[str, list[Section]]:
    """(header, sections) of a docs/benchmarks.md."""
    parts = re.split(r"(?m)^(?=## )", text)
    return parts[0].strip("\n"), [parse_section(part) for part in parts[1:]]


def render_document(header: str, sections: Iterable[Section]) -> str:
    return "\n\n".join([header.strip("\n"), *(render_section(s) for s in sections)]) + "\n"


def write_section(path: Path, section: Section) -> None:
    """Put one benchmark's section into the published file: in place of the section of the same
    title, else appended; every other section stays as it is, under this module's header."""
    sections = parse_document(path.read_text())[1] if path.exists() else []
    titles = [s.title for s in sections]
    if section.title in titles:
        sections[titles.index(section.title)] = section
    else:
        sections.append(section)
    path.write_text(render_document(DOC_HEADER, sections))
