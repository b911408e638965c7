"""A rank stopped beside DDP peers that wait in backward: the peers' Python stacks end in
autograd's engine, where DDP's reducer runs and waits on its gradient all_reduce from C++. Such a
stack is no evidence of a rank in its own code; the unretired all_reduce in the flight recorder is
the evidence of the wait, so the rank without a dump is named at failover confidence (real dumps of
the campaign's sigstop-one-rank and stuck-gil runs: tests/data/ddp-stopped-rank/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.collectors.sources.pystack import (
    Frame,
    ProcessStack,
    StackPlace,
    ThreadStack,
    load_dump_dir_stacks,
    where,
)
from faultlens.controller.hang_dump_dir import analyze_dump_dir

DATA = Path(__file__).parent / "data" / "ddp-stopped-rank"


def _main_thread(*frames: tuple[str, str]) -> ProcessStack:
    return ProcessStack(1, (ThreadStack(1, "MainThread", tuple(
        Frame(name, filename, 1) for name, filename in frames)),))


@pytest.mark.parametrize("engine_frame", [
    ("_engine_run_backward", "torch/autograd/graph.py"),
    ("backward", "/usr/lib/python3/site-packages/torch/autograd/__init__.py"),
])
def test_a_thread_inside_autograds_engine_is_in_an_unknown_place(
        engine_frame: tuple[str, str]) -> None:
    stack = _main_thread(engine_frame, ("Tensor.backward", "torch/_tensor.py"),
                         ("main", "train.py"))
    place = where(stack)
    assert place.kind is StackPlace.UNKNOWN
    assert "autograd" in place.text(3) and "no Python stack" not in place.text(3)


def test_user_code_under_backward_is_still_outside_collectives() -> None:
    """A custom autograd Function's backward in the user's own file is the user's code."""
    stack = _main_thread(("MyFn.backward", "model/layers.py"),
                         ("_engine_run_backward", "torch/autograd/graph.py"), ("main", "train.py"))
    assert where(stack).kind is StackPlace.OUTSIDE


@pytest.mark.parametrize("name", ["sigstop-one-rank", "stuck-gil", "sigstop-lagging-dump"])
def test_the_stopped_rank_is_named_at_failover_confidence(name: str) -> None:
    dumps = DATA / name / "dumps"
    stacks = load_dump_dir_stacks(dumps)
    assert sorted(stacks) == [0, 1, 3]
    _, report = analyze_dump_dir(dumps, stacks=stacks)
    assert report.culprit_ranks == (2,)
    assert report.missing_dumps == (2,)
    assert report.confidence >= 0.6


def _without_stack_of(stacks: dict[int, ProcessStack], rank: int,
                      *frames: tuple[str, str]) -> dict[int, ProcessStack]:
    out = dict(stacks)
    out[rank] = _main_thread(*frames) if frames else ProcessStack(None, (), "py-spy failed")
    return out


def test_a_rank_whose_stack_waits_in_the_op_is_no_culprit_whatever_its_dump_says() -> None:
    """sigstop-lagging-dump: rank 1's dump never entered all_reduce 32 (its peers did), but its
    stack is blocked in all_reduce: it waits, on the stopped rank 2 that wrote no dump, and the
    healthy node of rank 1 is not failed over."""
    dumps = DATA / "sigstop-lagging-dump" / "dumps"
    _, report = analyze_dump_dir(dumps, stacks=load_dump_dir_stacks(dumps))
    assert report.culprit_ranks == (2,), report.reason
    (root,) = report.roots
    assert set(root.waiting_ranks) == {0, 1, 3}
    # rank 1's dump ends inside all_reduce 31, which its peers completed (blocked.py: it waits
    # there, on the rank without a dump)
    assert any("rank(s) 1 never entered it by their dumps, yet their stacks are blocked" in line
               or "rank(s) 1 are still inside it by their dumps and stacks" in line
               for line in report.evidence), report.evidence


@pytest.mark.parametrize("stack", [
    (),  # no stack of rank 1 (py-spy failed): the dump's word stands
    (("DataLoader.__next__", "torch/utils/data/dataloader.py"), ("main", "train.py")),
    (("broadcast", "torch/distributed/distributed_c10d.py"), ("main", "train.py")),
], ids=["no-stack", "own-code", "another-op"])
def test_without_that_stack_the_lagging_rank_stays_what_its_dump_says(
        stack: tuple[tuple[str, str], ...]) -> None:
    """The same dumps with rank 1's stack taken away, in its own code, or blocked in another op
    than the one its peers wait in: nothing says it waits, so it is named (its dump lags its
    peers'), and the missing rank 2 is not what the others are said to wait on."""
    dumps = DATA / "sigstop-lagging-dump" / "dumps"
    stacks = _without_stack_of(load_dump_dir_stacks(dumps), 1, *stack)
    _, report = analyze_dump_dir(dumps, stacks=stacks)
    assert 1 in report.culprit_ranks, report.reason
    assert not any("yet their stacks are blocked" in line for line in report.evidence)
