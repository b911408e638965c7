"""A dump set as if one healthy rank had written no dump (written late, lost, its node's disk full):
each healthy rank of each set left out in turn, with its stack kept ("all"), without it
("lost-rank-without"), or with no stacks at all ("none": the trace alone). Shared by
tests/test_hang_perturbed.py and bench/bench_hang_lost_dump.py."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from faultlens.attribution.detectors.hang import HangReport, analyze_collectives
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.pystack import load_stack_dir

STACK_MODES = ("all", "lost-rank-without", "none")


def without(source: Path, target: Path, lost: int) -> Path:
    """The set's dump directory without rank `lost`'s dump (hard links where the file system
    allows).
    """
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.name != f"rank_{lost}.pkl":
            try:
                os.link(path, target / path.name)
            except OSError:
                shutil.copyfile(path, target / path.name)
    return target


def lost_dump_reports(scenarios: dict[str, Path], stacks: str, workdir: Path,
                      needs_stacks: set[str]) -> Iterator[tuple[str, int, set[int], HangReport]]:
    """(set name, the rank left out, the set's culprits, the analysis) for every set and healthy
    rank; sets whose name (after the '/') is in needs_stacks are left out where there are no stacks
    (their waits are in gloo send/recv, which only stacks show)."""
    for _, name, lost, culprits, report in lost_dump_reports_by_mode(
        scenarios, (stacks,), workdir, needs_stacks
    ):
        yield name, lost, culprits, report


def lost_dump_reports_by_mode(
    scenarios: dict[str, Path], modes: tuple[str, ...], workdir: Path, needs_stacks: set[str]
) -> Iterator[tuple[str, str, int, set[int], HangReport]]:
    """(stack mode, set name, the rank left out, the set's culprits, the analysis) for each of
    `modes` (STACK_MODES), as lost_dump_reports gives them one mode at a time; each set without its
    lost rank's dump is written and read once and analysed under every mode (the reading is the
    same for all of them, the stacks differ)."""
    for name, directory in sorted(scenarios.items()):
        wanted = [m for m in modes if not (m == "none" and name.split("/")[-1] in needs_stacks)]
        if not wanted:
            continue
        truth = json.loads((directory / "truth.json").read_text())
        culprits = {int(r) for r in truth["culprits"]}
        dumped = {int(path.stem.split("_")[1]) for path in (directory / "dumps").glob("rank_*.pkl")}
        all_stacks = load_stack_dir(directory / "stacks") if wanted != ["none"] else {}
        for lost in sorted(dumped - culprits):
            dumps = read_dump_dir(without(directory / "dumps", workdir / name / str(lost), lost))
            for mode in wanted:
                own = {
                    r: st
                    for r, st in (all_stacks.items() if mode != "none" else ())
                    if not (mode == "lost-rank-without" and r == lost)
                }
                yield (
                    mode,
                    name,
                    lost,
                    culprits,
                    analyze_collectives(
                        dumps.table, expected_ranks=range(truth["world_size"]), stacks=own
                    ),
                )
