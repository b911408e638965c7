"""The hang corpus: scenarios of an 8-rank job (TP 2 x DP 2 x PP 2, groups from new_group) with
known truth.

Pure data (no torch import): the worker (worker.py) runs them, the generator (generate.py) writes
each scenario's truth beside its dump set. Rank layout: rank = 4 * pp + 2 * dp + tp, so
  TP groups [0, 1] [2, 3] [4, 5] [6, 7], DP groups [0, 2] [1, 3] [4, 6] [5, 7], PP groups [0, 4] [1,
  5] [2, 6] [3, 7]
plus one WORLD group of all 8 ranks (a new_group of its own per scenario), and, for some scenarios,
an extra group.

A program is the list of operations one rank runs per training step; a fault changes one rank's
operation at one (step, op index). Fault kinds:
  stuck        the rank blocks outside any collective, in DataLoader.__next__, before the operation
  checkpoint   the same, in save_checkpoint
  skip         the rank leaves the operation out and goes on
  invert       the rank runs the operation after the next one (the two swapped)
  size         the rank's tensor has another shape, same element count (gloo completes such an
  all_reduce) op           the rank runs all_gather where its peers run all_reduce crash        the
  rank's training raises (a real Python exception) before the operation kill         the rank's
  process is SIGKILLed before the operation (it writes no dump; phase 2, last)
"""

from __future__ import annotations

from dataclasses import dataclass, field

WORLD_SIZE = 8
TP_GROUPS = ((0, 1), (2, 3), (4, 5), (6, 7))
DP_GROUPS = ((0, 2), (1, 3), (4, 6), (5, 7))
PP_GROUPS = ((0, 4), (1, 5), (2, 6), (3, 7))
DESCS = {
    "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "dp": "DATA_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
    "world": "WORLD",
    "extra": "EMBEDDING_GROUP",
}


def stage(rank: int) -> int:
    return rank // 4


# one operation: (group kind, op); op in all_reduce, broadcast, all_gather, gather, send, recv
Op = tuple[str, str]
#: per-step programs; "megatron" differs by pipeline stage (index 0: stage 0, 1: stage 1)
PROGRAMS: dict[str, tuple[tuple[Op, ...], tuple[Op, ...]]] = {
    # forward TP all_reduce, activations to the next stage, gradients back, TP all_reduce, DP and
    # WORLD all_reduce
    "megatron": (
        (
            ("tp", "all_reduce"),
            ("pp", "send"),
            ("pp", "recv"),
            ("tp", "all_reduce"),
            ("dp", "all_reduce"),
            ("world", "all_reduce"),
        ),
        (
            ("pp", "recv"),
            ("tp", "all_reduce"),
            ("tp", "all_reduce"),
            ("pp", "send"),
            ("dp", "all_reduce"),
            ("world", "all_reduce"),
        ),
    ),
    "dense": ((("tp", "all_reduce"), ("dp", "all_reduce"), ("world", "all_reduce")),) * 2,
    # the embedding all_reduce of first and last stage (Megatron) on the PP groups: a chain TP -> DP
    # -> PP
    "chain": ((("tp", "all_reduce"), ("dp", "all_reduce"), ("pp", "all_reduce")),) * 2,
    # stage-local work only (TP, DP): ranks 0-3 and 4-7 never wait on each other
    "stagelocal": ((("tp", "all_reduce"), ("dp", "all_reduce")),) * 2,
    "tp_world": ((("tp", "all_reduce"), ("world", "all_reduce")),) * 2,
    "gather": ((("tp", "all_reduce"), ("world", "gather")),) * 2,
    # an extra group [2, 5] (unique desc: no other group plays its role) then WORLD
    "extra_world": ((("extra", "all_reduce"), ("world", "all_reduce")),) * 2,
    "broadcast": ((("tp", "broadcast"), ("dp", "all_reduce"), ("world", "all_reduce")),) * 2,
}
EXTRA_GROUP = (2, 5)
# worker status key of a scenario's faults a rank carried out (beside its progress)
FAULTS_SUFFIX = "#faults"
WRITES_KEY = "#writes"  # worker status key: how many times the rank has written its status so far


@dataclass(frozen=True)
class GroupSpec:
    """Groups of one kind, created in this order (worker.py): via new_group (one call per group),
    new_subgroups (consecutive blocks of the launch's world), enumeration
    (new_subgroups_by_enumeration) or default (the default group, WORLD); desc None leaves torch's
    own ('undefined')."""

    kind: str
    groups: tuple[tuple[int, ...], ...]
    desc: str | None
    via: str = "new_group"


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    op: int  # index into the rank's per-step program
    kind: str


@dataclass(frozen=True)
class CorpusScenario:
    name: str
    description: str
    program: str
    steps: int
    faults: tuple[Fault, ...]
    culprits: tuple[int, ...]  # the truth: the ranks an exact answer names
    # culprit -> what it did (truth, for the reader)
    kinds: dict[int, str] = field(default_factory=dict)
    phase: int = 1  # 2: runs after every phase-1 dump is written (a SIGKILL ends the process)
    # a cycle no information can order: the truth is the whole cycle, low confidence
    unorderable: bool = False

    world_size: int = WORLD_SIZE

    def program_of(self, rank: int) -> tuple[Op, ...]:
        return PROGRAMS[self.program][stage(rank)]

    def group_specs(self) -> list[GroupSpec]:
        specs = [GroupSpec("world", (tuple(range(WORLD_SIZE)),), DESCS["world"])]
        specs += [
            GroupSpec(kind, table, DESCS[kind])
            for kind, table in (("tp", TP_GROUPS), ("dp", DP_GROUPS), ("pp", PP_GROUPS))
        ]
        if self.program == "extra_world":
            specs.append(GroupSpec("extra", (EXTRA_GROUP,), DESCS["extra"]))
        return specs

    def to_truth(self) -> dict:
        return {
            "scenario": self.name,
            "description": self.description,
            "program": self.program,
            "steps": self.steps,
            "world_size": WORLD_SIZE,
            "culprits": list(self.culprits),
            "kinds": {str(k): v for k, v in self.kinds.items()},
            "unorderable": self.unorderable,
            "faults": [f.__dict__ for f in self.faults],
            "groups": {"tp": TP_GROUPS, "dp": DP_GROUPS, "pp": PP_GROUPS, "extra": EXTRA_GROUP},
        }


def _s(
    name: str,
    description: str,
    program: str,
    steps: int,
    faults: list[tuple[int, int, int, str]],
    culprits: tuple[int, ...],
    kinds: dict[int, str] | None = None,
    **kw,
) -> CorpusScenario:
    return CorpusScenario(
        name,
        description,
        program,
        steps,
        tuple(Fault(*f) for f in faults),
        culprits,
        kinds or {},
        **kw,
    )


SCENARIOS: tuple[CorpusScenario, ...] = (
    _s("healthy", "no fault: every rank finishes every step", "megatron", 3, [], ()),
    _s(
        "stuck_tp",
        "rank 3 blocks in its data loader before the forward TP all_reduce of step 2",
        "megatron",
        4,
        [(3, 2, 0, "stuck")],
        (3,),
        {3: "stuck_outside"},
    ),
    _s(
        "stuck_dp",
        "rank 5 blocks in its data loader before the DP all_reduce of step 1",
        "megatron",
        3,
        [(5, 1, 4, "stuck")],
        (5,),
        {5: "stuck_outside"},
    ),
    _s(
        "stuck_world",
        "rank 6 blocks in save_checkpoint before the WORLD all_reduce of step 1",
        "megatron",
        3,
        [(6, 1, 5, "checkpoint")],
        (6,),
        {6: "stuck_outside"},
    ),
    _s(
        "two_independent_near",
        "ranks 1 and 6 (different TP groups) block in their data loaders at "
        "the same "
        "point of step 2",
        "megatron",
        4,
        [(1, 2, 0, "stuck"), (6, 2, 1, "stuck")],
        (1, 6),
        {1: "stuck_outside", 6: "stuck_outside"},
    ),
    _s(
        "two_independent_apart",
        "stage-local work: rank 2 blocks before step 1's TP all_reduce; "
        "ranks 4-7 go on "
        "for 24 more steps (48 collectives later: the order of events a gap of minutes leaves) "
        "until rank 7 blocks",
        "stagelocal",
        30,
        [(2, 1, 0, "stuck"), (7, 25, 1, "stuck")],
        (2, 7),
        {2: "stuck_outside", 7: "stuck_outside"},
    ),
    _s(
        "three_independent",
        "ranks 0, 3 and 5 block at step 2 in three different groups",
        "dense",
        4,
        [(0, 2, 0, "stuck"), (3, 2, 1, "stuck"), (5, 2, 2, "stuck")],
        (0, 3, 5),
        {0: "stuck_outside", 3: "stuck_outside", 5: "stuck_outside"},
    ),
    _s(
        "two_in_one_group",
        "ranks 4 and 5 (one TP group) both block before step 1's TP all_reduce",
        "dense",
        3,
        [(4, 1, 0, "stuck"), (5, 1, 0, "stuck")],
        (4, 5),
        {4: "stuck_outside", 5: "stuck_outside"},
    ),
    _s(
        "skip_early_subgroup",
        "rank 0 leaves out its first TP all_reduce (step 0, no history) and "
        "goes on: rank 1 "
        "waits in TP, rank 3 waits for rank 1 in DP, everyone else in WORLD",
        "dense",
        3,
        [(0, 0, 0, "skip")],
        (0,),
        {0: "skipped"},
    ),
    _s(
        "skip_late_subgroup",
        "rank 6 leaves out the DP all_reduce of step 8 after a long periodic history",
        "dense",
        10,
        [(6, 8, 1, "skip")],
        (6,),
        {6: "skipped"},
    ),
    _s(
        "skip_early_dp",
        "rank 5 leaves out its first DP all_reduce (step 0) and goes on into WORLD",
        "dense",
        3,
        [(5, 0, 1, "skip")],
        (5,),
        {5: "skipped"},
    ),
    _s(
        "invert_order",
        "rank 0 runs WORLD before TP in step 0, every other rank TP before WORLD",
        "tp_world",
        3,
        [(0, 0, 0, "invert")],
        (0,),
        {0: "skipped"},
    ),
    _s(
        "unorderable_cycle",
        "rank 5 runs WORLD before the [2, 5] group's all_reduce in step 0; the group has no "
        "peer group and no history, so nothing tells rank 5's order from rank 2's: the cycle "
        "{2, 5} is the answer, at low confidence",
        "extra_world",
        2,
        [(5, 0, 0, "invert")],
        (2, 5),
        {2: "cycle", 5: "cycle"},
        unorderable=True,
    ),
    _s(
        "chain_three_groups",
        "rank 0 blocks before step 2's TP all_reduce: rank 1 waits in TP, "
        "rank 3 in DP for "
        "rank 1, rank 7 in PP for rank 3",
        "chain",
        4,
        [(0, 2, 0, "stuck")],
        (0,),
        {0: "stuck_outside"},
    ),
    _s(
        "pipeline_send_hang",
        "stage-0 rank 1 blocks before sending step 1's activations: rank 5 "
        "waits in recv, "
        "rank 4 waits for rank 5 in TP",
        "megatron",
        3,
        [(1, 1, 1, "stuck")],
        (1,),
        {1: "stuck_outside"},
    ),
    _s(
        "pipeline_bwd_hang",
        "stage-1 rank 7 blocks before sending step 2's gradients back: rank 3 "
        "waits in recv, "
        "rank 2 waits for rank 3 in TP",
        "megatron",
        4,
        [(7, 2, 3, "stuck")],
        (7,),
        {7: "stuck_outside"},
    ),
    _s(
        "gather_root_waits",
        "rank 6 never joins a WORLD gather: the root (rank 0) waits inside it "
        "while the other "
        "senders complete",
        "gather",
        3,
        [(6, 1, 1, "stuck")],
        (6,),
        {6: "stuck_outside"},
    ),
    _s(
        "size_mismatch",
        "rank 5 all_reduces its WORLD tensor as shape [1, 16] where the others use "
        "[16] (gloo "
        "completes it; only the trace shows it)",
        "dense",
        3,
        [(5, 1, 2, "size")],
        (5,),
        {5: "size_mismatch"},
    ),
    _s(
        "op_mismatch",
        "rank 2 runs all_gather where its WORLD peers run all_reduce",
        "dense",
        3,
        [(2, 1, 2, "op")],
        (2,),
        {2: "op_mismatch"},
    ),
    _s(
        "mismatch_then_hang",
        "rank 3's WORLD all_reduce of step 0 has another shape (completes), "
        "and later rank 6 "
        "blocks in its data loader at step 2: two independent roots",
        "dense",
        4,
        [(3, 0, 2, "size"), (6, 2, 0, "stuck")],
        (3, 6),
        {3: "size_mismatch", 6: "stuck_outside"},
    ),
    _s(
        "hang_plus_crash",
        "rank 1 blocks in its data loader before step 2's TP all_reduce while "
        "rank 6 raises "
        "before its DP all_reduce of step 2",
        "dense",
        4,
        [(1, 2, 0, "stuck"), (6, 2, 1, "crash")],
        (1, 6),
        {1: "stuck_outside", 6: "crashed"},
    ),
    _s(
        "broadcast_stuck",
        "rank 3 blocks before step 1's TP broadcast, whose root (rank 2) sends and goes on",
        "broadcast",
        3,
        [(3, 1, 0, "stuck")],
        (3,),
        {3: "stuck_outside"},
    ),
    _s(
        "sigkill",
        "rank 4 is SIGKILLed before step 2's TP all_reduce and writes no dump",
        "dense",
        4,
        [(4, 2, 0, "kill")],
        (4,),
        {4: "missing_dump"},
        phase=2,
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}
