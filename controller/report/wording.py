"""Short phrases for people: rank lists, culprits, restores, durations (shared by the demo summary,
`faultlens jobs`, `faultlens incident` and the HTML report)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

# causes where the code, not a machine, is to blame: no node is a culprit
CODE_CAUSES = {"software", "oom", "workload_imbalance"}


def ranks_text(ranks: Iterable[int]) -> str:
    """0,1,2,3,7 -> '0-3,7'."""
    values = sorted({int(r) for r in ranks})
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else (f"{values[i]},{values[j]}" if j == i + 1
                                                    else f"{values[i]}-{values[j]}"))
        i = j + 1
    return ",".join(parts)


def culprit_text(
    nodes: Sequence[str] | None,
    ranks: Sequence[int] | None,
    gpus: Sequence[str] | None = (),
    cause: str | None = None,
) -> str:
    """'node-1 rank 3 (GPU GPU-1a2b...)'; a fault of the code: 'the code (ranks 0-3)'; nothing
    known: 'unknown'.
    """
    nodes, ranks, gpus = list(nodes or ()), list(ranks or ()), list(gpus or ())
    rank_part = ""
    if ranks:
        rank_part = ("rank " if len(ranks) == 1 else "ranks ") + ranks_text(ranks)
    if not nodes:
        if cause in CODE_CAUSES:
            return "the code" + (f" (every rank that ran it: {ranks_text(ranks)})" if ranks else "")
        return (rank_part + " (no single node)") if rank_part else "unknown"
    text = ",".join(nodes) + (f" {rank_part}" if rank_part else "")
    if gpus:
        text += " (GPU " + ", ".join(gpus) + ")"
    return text


def short_path(path: str | Path) -> str:
    """A path relative to the working directory when it lies below it (shorter, still
    copy-pasteable).
    """
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def restore_text(step: int | None, tier: str | None) -> str:
    return "from scratch" if step is None else f"from step {step}" + (f" ({tier})" if tier else "")


def seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 100:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
