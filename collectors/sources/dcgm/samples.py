"""A scrape's text into samples with prometheus_client's parser (the whole scrape, else line by
line, bad lines counted), the parse counts, and the line a sample came from (for bad-sample
examples)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

MAX_LINE_CHARS = 4096  # a dcgm-exporter line is a few hundred characters (labels included)
_WHITESPACE_RUN = re.compile(r"\s+")


@dataclass
class DcgmStats:
    """What a parser read: scrapes, lines, samples, and the samples it left out (bad, blank,
    unmapped).
    """

    scrapes: int = 0
    lines: int = 0
    samples_read: int = 0
    bad_lines: int = 0
    blank_values: int = 0
    unmapped: int = 0
    bad_examples: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Sample:
    """One sample of a scrape as prometheus_client parsed it."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None


def read_samples(text: str, stats: DcgmStats, bad: Callable[[int, str], None]) -> list[Sample]:
    """The samples of a scrape; `stats.lines` counts its lines and `bad(line number, reason)` each
    line left out.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    stats.lines += len(lines)
    # prometheus_client's text parser is quadratic in the whitespace-separated tokens of a line: a
    # 30 KB comment line of tabs takes seconds. Lines longer than a real exporter writes are bad
    # lines; comment lines keep one space between words. Everything after this is linear in the
    # scrape.
    cleaned = False
    for index, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            bad(index + 1, f"line longer than {MAX_LINE_CHARS} characters")
            lines[index] = ""
            cleaned = True
        elif line.startswith("#") and ("  " in line or "\t" in line):
            lines[index] = _WHITESPACE_RUN.sub(" ", line)
            cleaned = True
    if cleaned:
        text = "\n".join(lines) + "\n"
    try:
        return [Sample(s.name, s.labels, s.value, s.timestamp)
                for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception:
        pass
    samples = []
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            for family in text_string_to_metric_families(stripped + "\n"):
                samples.extend(
                    Sample(s.name, s.labels, s.value, s.timestamp) for s in family.samples
                )
        except Exception as exc:
            bad(number, f"{type(exc).__name__}: {str(exc)[:120]}")
    return samples


def sample_line(lines: list[str], cursor: int, sample: Sample) -> tuple[int, int]:
    """(line number, next cursor) of a sample: the first of `lines` from `cursor` on (then from the
    top) that holds its name, labels and value; (0, cursor) when none does."""
    values = [f'"{value}"' for value in sample.labels.values()]
    order = list(range(cursor, len(lines))) + list(range(0, min(cursor, len(lines))))
    for index in order:
        line = lines[index]
        number = index + 1
        if not (line.startswith(sample.name) and all(value in line for value in values)):
            continue
        try:
            parsed = [
                s for family in text_string_to_metric_families(line + "\n") for s in family.samples
            ]
        except Exception:
            continue
        same = [
            s
            for s in parsed
            if s.labels == sample.labels
            and s.timestamp == sample.timestamp
            and (s.value == sample.value or (s.value != s.value and sample.value != sample.value))
        ]
        if same:
            return number, index + 1
    return 0, cursor
