"""The skip-before-history family: real gloo jobs (job.py) in which one rank leaves out a
collective, or the send of a send/recv pair, of a sub-group before that group has any history on
it (its first step), and goes on. Its peer in that group waits there until gloo's timeout (gloo then
records the collective as completed); ranks of a second (and third) sub-group that need the waiting
rank wait on it in turn (a chain); every other rank, the skipper among them, waits in the world
collective that ends the step. Each rank dumps on the way out of its timeout.

Pure data (no torch import): what job.py runs and what an exact answer is. Truth: the skipper
alone; every other rank only waited (a victim) and must not be named.
"""

from __future__ import annotations

from dataclasses import dataclass

#: one operation of a step: (group kind, op); op in all_reduce, send_up (the group's lower rank
#: sends to its higher one, which receives)
Op = tuple[str, str]


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    world: int
    #: group kind -> (desc or None for new_group's own 'undefined', the groups), in creation order;
    #: a program's kind 'world' is the default group
    groups: tuple[tuple[str, str | None, tuple[tuple[int, ...], ...]], ...]
    program: tuple[Op, ...]  # every rank's step (an op of a group it is not in is passed over)
    skipper: int
    skip_op: int  # index into program
    skip_step: int = 0
    steps: int = 3

    @property
    def waiters(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.world) if r != self.skipper)

    def truth(self) -> dict:
        return {
            "shape": self.name,
            "description": self.description,
            "world_size": self.world,
            "culprits": [self.skipper],
            "victims": list(self.waiters),
            "skipped": list(self.program[self.skip_op]),
            "skip_step": self.skip_step,
            "groups": {kind: [list(g) for g in table] for kind, _, table in self.groups},
        }


def _pairs(world: int) -> tuple[tuple[int, ...], ...]:
    return tuple((r, r + 1) for r in range(0, world, 2))


def _layout8() -> tuple[tuple[str, str | None, tuple[tuple[int, ...], ...]], ...]:
    # TP2 x DP2 x PP2, rank = 4 pp + 2 dp + tp, Megatron's descs
    return (
        ("tp", "TENSOR_MODEL_PARALLEL_GROUP", _pairs(8)),
        ("dp", "DATA_PARALLEL_GROUP", ((0, 2), (1, 3), (4, 6), (5, 7))),
        ("pp", "PIPELINE_MODEL_PARALLEL_GROUP", ((0, 4), (1, 5), (2, 6), (3, 7))),
    )


SHAPES: tuple[Shape, ...] = (
    Shape(
        "pair_4",
        "rank 1 leaves out its first all_reduce of pair [0, 1]; rank 0 waits in it, the others in "
        "the world all_reduce that ends the step",
        4,
        (("pair", "pair", _pairs(4)),),
        (("pair", "all_reduce"), ("world", "all_reduce")),
        skipper=1,
        skip_op=0,
    ),
    Shape(
        "pair_8",
        "rank 6 leaves out its first all_reduce of pair [6, 7]; rank 7 waits in it, the others in "
        "the world all_reduce that ends the step",
        8,
        (("pair", None, _pairs(8)),),
        (("pair", "all_reduce"), ("world", "all_reduce")),
        skipper=6,
        skip_op=0,
    ),
    Shape(
        "pair_p2p_4",
        "after the world all_reduce, rank 2 leaves out its first send to rank 3 (pair [2, 3]); "
        "rank 3 waits in the recv, the others in the next step's world all_reduce",
        4,
        (("pair", "pair", _pairs(4)),),
        (("world", "all_reduce"), ("pair", "send_up")),
        skipper=2,
        skip_op=1,
    ),
    Shape(
        "pair_p2p_8",
        "after the world all_reduce, rank 4 leaves out its first send to rank 5 (pair [4, 5]); "
        "rank 5 waits in the recv, the others in the next step's world all_reduce",
        8,
        (("pair", "pair", _pairs(8)),),
        (("world", "all_reduce"), ("pair", "send_up")),
        skipper=4,
        skip_op=1,
    ),
    Shape(
        "chain2_4",
        "after the world all_reduce, rank 3 leaves out its first tp all_reduce ([2, 3]); rank 2 "
        "waits in it, rank 0 for rank 2 in dp [0, 2], ranks 1 and 3 in the next step's world "
        "all_reduce",
        4,
        (
            ("tp", "tp", _pairs(4)),
            ("dp", "dp", ((0, 2), (1, 3))),
        ),
        (("world", "all_reduce"), ("tp", "all_reduce"), ("dp", "all_reduce")),
        skipper=3,
        skip_op=1,
    ),
    Shape(
        "chain2_8",
        "after the world all_reduce, rank 5 leaves out its first TP all_reduce ([4, 5]); rank 4 "
        "waits in it, rank 6 for rank 4 in DP [4, 6], the others in the next step's world "
        "all_reduce",
        8,
        tuple(g for g in _layout8() if g[0] != "pp"),
        (("world", "all_reduce"), ("tp", "all_reduce"), ("dp", "all_reduce")),
        skipper=5,
        skip_op=1,
    ),
    Shape(
        "chain3_4",
        "groups without a desc [2, 3], [1, 2], [0, 1], called in that order: rank 3 leaves out "
        "the first all_reduce of [2, 3]; rank 2 waits in it, rank 1 for rank 2 in [1, 2], rank 0 "
        "for rank 1 in [0, 1], rank 3 in the world all_reduce",
        4,
        (
            ("a", None, ((2, 3),)),
            ("b", None, ((1, 2),)),
            ("c", None, ((0, 1),)),
        ),
        (("a", "all_reduce"), ("b", "all_reduce"), ("c", "all_reduce"), ("world", "all_reduce")),
        skipper=3,
        skip_op=0,
    ),
    Shape(
        "chain3_8",
        "rank 7 leaves out its first TP all_reduce ([6, 7]); rank 6 waits in it, rank 4 for rank "
        "6 in DP [4, 6], rank 2 for rank 6 and rank 0 for rank 4 in PP, the others in the world "
        "all_reduce",
        8,
        _layout8(),
        (
            ("tp", "all_reduce"),
            ("dp", "all_reduce"),
            ("pp", "all_reduce"),
            ("world", "all_reduce"),
        ),
        skipper=7,
        skip_op=0,
    ),
)
BY_NAME = {shape.name: shape for shape in SHAPES}
#: the two forms of each set: torch's own dump (gloo's pg_config keyed '' with no ranks) and
#: faultlens' trigger's (pg_config repaired from torch's group tables)
FORMS = ("raw", "repaired")
