"""A waiter whose dump lags its own entry into the collective it is blocked in: the flight recorder
is read a moment before (or after) the stack, so a rank whose Python stack is inside a collective
may show no entry of it. Such a rank waits, whatever its dump says; the rank the others wait on
stays the culprit (the campaign's wrong failover: tests/test_hang_ddp_backward_stacks.py).

From real dumps: the hang corpus' stuck-rank sets (8-rank gloo jobs, py-spy stacks), each waiter
whose stack is blocked in a collective in turn given the dump it would have written just before it
entered it (its last entry left out). Every such set: the culprits exact, the waiter in no root.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from faultlens.attribution.detectors.hang import analyze_collectives
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.pystack import StackPlace, load_stack_dir, where

pytest.importorskip("torch")

STUCK_SETS = ["stuck_world", "stuck_dp", "stuck_tp", "broadcast_stuck", "two_in_one_group"]


@pytest.fixture(scope="module")
def hang_corpus() -> dict[str, Path]:
    from tests.torch_jobs.hang_corpus.generate import corpus

    return corpus()


@pytest.mark.parametrize("name", STUCK_SETS)
def test_a_waiter_whose_dump_lags_its_entry_is_no_culprit(hang_corpus, name: str) -> None:
    directory = hang_corpus[name]
    truth = json.loads((directory / "truth.json").read_text())
    stacks = load_stack_dir(directory / "stacks")
    table = read_dump_dir(directory / "dumps").table
    waiters = [r for r, s in sorted(stacks.items())
               if r not in truth["culprits"] and where(s).kind == StackPlace.IN_COLLECTIVE]
    assert waiters
    for waiter in waiters:
        mine = pc.equal(table.column("rank"), waiter)
        last = pc.max(pc.filter(table.column("record_id"), mine)).as_py()
        lagging = table.filter(
            pc.fill_null(pc.invert(pc.and_(mine, pc.equal(table.column("record_id"), last))), True)
        )
        assert lagging.num_rows == table.num_rows - 1
        report = analyze_collectives(
            lagging, expected_ranks=range(truth["world_size"]), stacks=stacks
        )
        assert sorted(report.culprit_ranks) == sorted(truth["culprits"]), (waiter, report.reason)
        assert not any(waiter in root.ranks for root in report.roots), (waiter, report.reason)
