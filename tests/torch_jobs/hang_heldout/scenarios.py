"""The held-out hang set: real gloo jobs whose shapes the hang corpus (hang_corpus: one 8-rank TP2 x
DP2 x PP2 layout, Megatron descs, groups from new_group) does not have, with the corpus' fault
families in them.

Pure data (no torch import). The corpus' worker and generator run them (hang_corpus/worker.py loads
a suite by name): MAIN, a launch of 16 processes in which each scenario's job is ranks 0 .. n-1 (the
other processes create its groups and sit it out), and DEFAULT_ONLY, a launch of 4 processes whose
phase-1 scenario uses nothing but the default group (a process has one default group, so one such
scenario per launch), and whose phase 2 (a SIGKILL) is a 4-stage pipeline on groups of its own.

Layouts (dims fastest-varying first: rank = sum(coord[k] * stride[k])):
  l6   TP3 x DP2, rank = tp + 3 dp; DP groups created first (new_subgroups_by_enumeration), then TP,
  then a
       6-rank group without a desc ('undefined')
  l12  DP3 x TP2 x PP2, rank = dp + 3 tp + 6 pp (data-parallel fastest: not Megatron's order); every
  group
       without a desc, created PP, TP, DP, then a 12-rank group; a 2-stage pipeline where the
       program has one
  l16  TP2 x EP2 x DP2 x PP2 in Megatron's order (rank = tp + 2 ep + 4 dp + 8 pp), Megatron descs,
  groups created
       in reverse (world, PP, DP, EP, TP)
  l16b TP4 x DP4, rank = tp + 4 dp: TP from new_subgroups (no desc), DP from
  new_subgroups_by_enumeration; no
       group spans the job
  l8   PP4 x TP2, rank = pp + 4 tp (pipeline-major): a 4-stage pipeline, send/recv to the next and
  previous
       stage inside 4-rank PP groups
  l4   the default group only (DEFAULT_ONLY)
  l4p  PP4 alone: a 4-stage pipeline and an all_reduce of its stages (DEFAULT_ONLY, phase 2)

Fault kinds and truth vocabulary: hang_corpus/scenarios.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from tests.torch_jobs.hang_corpus.scenarios import Fault, GroupSpec, Op

MEGATRON = {
    "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "dp": "DATA_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
    "ep": "EXPERT_MODEL_PARALLEL_GROUP",
    "world": "WORLD",
}


@dataclass(frozen=True)
class Layout:
    name: str
    dims: tuple[tuple[str, int], ...]  # fastest-varying first
    #: creation order: (kind, desc, via); kind 'world' is one group of every rank of the job
    creation: tuple[tuple[str, str | None, str], ...]

    @property
    def world_size(self) -> int:
        return math.prod(size for _, size in self.dims)

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for kind, size in self.dims:
            out[kind] = rank % size
            rank //= size
        return out

    def groups(self, kind: str) -> tuple[tuple[int, ...], ...]:
        if kind == "world":
            return (tuple(range(self.world_size)),)
        by_rest: dict[tuple, list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            by_rest.setdefault(tuple(v for k, v in c.items() if k != kind), []).append(rank)
        # ranks in the kind's coordinate order (a pipeline group in stage order)
        return tuple(tuple(sorted(ranks, key=lambda r: self.coords(r)[kind])) for ranks in
                     sorted(by_rest.values()))

    def stage(self, rank: int) -> int:
        return self.coords(rank).get("pp", 0)

    @property
    def stages(self) -> int:
        return dict(self.dims).get("pp", 1)

    def group_specs(self) -> list[GroupSpec]:
        return [GroupSpec(kind, self.groups(kind), desc, via) for kind, desc, via in self.creation]

    def describe(self) -> dict:
        return {
            "name": self.name,
            "dims_fastest_first": [list(d) for d in self.dims],
            "creation_order": [list(c) for c in self.creation],
            "groups": {kind: [list(g) for g in self.groups(kind)] for kind, _, _ in self.creation},
        }


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout(
            "l6",
            (("tp", 3), ("dp", 2)),
            (
                ("dp", MEGATRON["dp"], "enumeration"),
                ("tp", MEGATRON["tp"], "new_group"),
                ("world", None, "new_group"),
            ),
        ),
        Layout(
            "l12",
            (("dp", 3), ("tp", 2), ("pp", 2)),
            (
                ("pp", None, "new_group"),
                ("tp", None, "new_group"),
                ("dp", None, "new_group"),
                ("world", None, "new_group"),
            ),
        ),
        Layout(
            "l16",
            (("tp", 2), ("ep", 2), ("dp", 2), ("pp", 2)),
            tuple((k, MEGATRON[k], "new_group") for k in ("world", "pp", "dp", "ep", "tp")),
        ),
        Layout(
            "l16b",
            (("tp", 4), ("dp", 4)),
            (("tp", None, "new_subgroups"), ("dp", MEGATRON["dp"], "enumeration")),
        ),
        Layout(
            "l8",
            (("pp", 4), ("tp", 2)),
            (
                ("tp", MEGATRON["tp"], "new_group"),
                ("pp", MEGATRON["pp"], "enumeration"),
                ("world", None, "new_group"),
            ),
        ),
        Layout("l4", (("dp", 4),), (("world", "default_pg", "default"),)),
        Layout("l4p", (("pp", 4),), (("pp", MEGATRON["pp"], "new_group"),)),
    )
}

AR = "all_reduce"


def _megatron2(stage: int, stages: int) -> tuple[Op, ...]:
    """Two stages: forward TP, activations on, gradients back, backward TP, DP, world (hang_corpus'
    megatron).
    """
    if stage == 0:
        return (("tp", AR), ("pp", "send"), ("pp", "recv"), ("tp", AR), ("dp", AR), ("world", AR))
    return (("pp", "recv"), ("tp", AR), ("tp", AR), ("pp", "send"), ("dp", AR), ("world", AR))


def _pipeline(stage: int, stages: int) -> tuple[Op, ...]:
    """Any number of stages: receive activations, forward TP, send them on; receive gradients,
    backward TP, send them back; then the world all_reduce."""
    first, last = stage == 0, stage == stages - 1
    forward = (
        ([] if first else [("pp", "recv_prev")])
        + [("tp", AR)]
        + ([] if last else [("pp", "send_next")])
    )
    backward = (
        ([] if last else [("pp", "recv_next")])
        + [("tp", AR)]
        + ([] if first else [("pp", "send_prev")])
    )
    return tuple(forward + backward + [("world", AR)])


def _pipeline_only(stage: int, stages: int) -> tuple[Op, ...]:
    """A pipeline with no other parallelism: activations on, gradients back, then an all_reduce of
    the stages.
    """
    first, last = stage == 0, stage == stages - 1
    forward = ([] if first else [("pp", "recv_prev")]) + ([] if last else [("pp", "send_next")])
    backward = ([] if last else [("pp", "recv_next")]) + ([] if first else [("pp", "send_prev")])
    return tuple(forward + backward + [("pp", AR)])


def _fixed(*ops: Op) -> Callable[[int, int], tuple[Op, ...]]:
    return lambda stage, stages: ops


PROGRAMS: dict[str, Callable[[int, int], tuple[Op, ...]]] = {
    "tp_dp_world": _fixed(("tp", AR), ("dp", AR), ("world", AR)),
    "tp_dp": _fixed(("tp", AR), ("dp", AR)),  # no group spans stages: stage-local work
    "moe": _fixed(("tp", AR), ("ep", AR), ("dp", AR), ("world", AR)),
    "chain4": _fixed(("tp", AR), ("ep", AR), ("dp", AR), ("pp", AR)),
    "megatron2": _megatron2,
    "pipeline": _pipeline,
    "pipeline_only": _pipeline_only,
    "default": _fixed(("world", AR), ("world", "broadcast"), ("world", AR)),
    # the collectives other training code runs (third wave): FSDP's sharded data parallelism, MoE
    # token exchange, a rooted scatter (only its root records an input), a barrier
    "fsdp": _fixed(
        ("tp", AR), ("dp", "all_gather_into_tensor"), ("dp", "reduce_scatter"), ("world", AR)
    ),
    "moe_a2a": _fixed(
        ("tp", AR), ("ep", "all_to_all"), ("ep", "all_to_all"), ("dp", AR), ("world", AR)
    ),
    "scatter_tp": _fixed(("tp", "scatter"), ("dp", AR), ("world", AR)),
    "barrier_dp": _fixed(("tp", AR), ("dp", "barrier"), ("world", AR)),
}


@dataclass(frozen=True)
class HeldoutScenario:
    name: str
    layout: str
    description: str
    program: str
    steps: int
    faults: tuple[Fault, ...]
    culprits: tuple[int, ...]
    kinds: dict[int, str] = field(default_factory=dict)
    phase: int = 1
    unorderable: bool = False
    step_sleep_s: float = 0.0  # every rank sleeps this long between steps (faults seconds apart)

    @property
    def world_size(self) -> int:
        return LAYOUTS[self.layout].world_size

    def program_of(self, rank: int) -> tuple[Op, ...]:
        layout = LAYOUTS[self.layout]
        return PROGRAMS[self.program](layout.stage(rank), layout.stages)

    def group_specs(self) -> list[GroupSpec]:
        return LAYOUTS[self.layout].group_specs()

    def to_truth(self) -> dict:
        return {
            "scenario": self.name,
            "description": self.description,
            "layout": LAYOUTS[self.layout].describe(),
            "program": self.program,
            "steps": self.steps,
            "world_size": self.world_size,
            "culprits": list(self.culprits),
            "kinds": {str(k): v for k, v in self.kinds.items()},
            "unorderable": self.unorderable,
            "faults": [f.__dict__ for f in self.faults],
            "step_sleep_s": self.step_sleep_s,
            "programs": {
                str(s): [list(op) for op in PROGRAMS[self.program](s, LAYOUTS[self.layout].stages)]
                for s in range(LAYOUTS[self.layout].stages)
            },
        }


def _h(
    name: str,
    layout: str,
    description: str,
    program: str,
    steps: int,
    faults: list[tuple[int, int, int, str]],
    kinds: dict[int, str] | None = None,
    **kw,
) -> HeldoutScenario:
    kinds = kinds or {}
    return HeldoutScenario(
        name,
        layout,
        description,
        program,
        steps,
        tuple(Fault(*f) for f in faults),
        tuple(sorted(kinds)),
        kinds,
        **kw,
    )


SO = "stuck_outside"
MAIN_SCENARIOS: tuple[HeldoutScenario, ...] = (
    # l6: TP3 x DP2 (rank = tp + 3 dp), program tp_dp_world
    _h("l6_healthy", "l6", "no fault", "tp_dp_world", 3, []),
    _h(
        "l6_stuck_tp_step1",
        "l6",
        "rank 4 blocks in its data loader before step 1's TP all_reduce: "
        "ranks 3, 5 wait "
        "in TP, ranks 0-2 in DP",
        "tp_dp_world",
        3,
        [(4, 1, 0, "stuck")],
        {4: SO},
    ),
    _h(
        "l6_skip_early_dp",
        "l6",
        "rank 2 leaves out its first DP all_reduce (step 0, no history) "
        "and goes on into "
        "the 6-rank group (no desc): rank 5 waits in DP for it, it waits for rank 5 there",
        "tp_dp_world",
        3,
        [(2, 0, 1, "skip")],
        {2: "skipped"},
    ),
    _h(
        "l6_size_dp",
        "l6",
        "rank 1 all_reduces its DP tensor as [1, 16] where rank 4 uses [16] at "
        "step 1 (gloo "
        "completes it)",
        "tp_dp_world",
        3,
        [(1, 1, 1, "size")],
        {1: "size_mismatch"},
    ),
    _h(
        "l6_op_tp",
        "l6",
        "rank 5 runs all_gather where its TP peers (3, 4: a group of three) run "
        "all_reduce at "
        "step 1",
        "tp_dp_world",
        3,
        [(5, 1, 0, "op")],
        {5: "op_mismatch"},
    ),
    # l12: DP3 x TP2 x PP2, rank = dp + 3 tp + 6 pp, no descs
    _h(
        "l12_stuck_dp_step6",
        "l12",
        "rank 7 blocks in its data loader before step 6's DP all_reduce (groups without descs)",
        "tp_dp_world",
        8,
        [(7, 6, 1, "stuck")],
        {7: SO},
    ),
    _h(
        "l12_two_apart",
        "l12",
        "stage-local work: rank 2 blocks before step 1's TP all_reduce; "
        "stage 1 (ranks "
        "6-11) goes on, 0.1 s a step, for 24 more steps until rank 10 blocks before its DP "
        "all_reduce",
        "tp_dp",
        30,
        [(2, 1, 0, "stuck"), (10, 25, 1, "stuck")],
        {2: SO, 10: SO},
        step_sleep_s=0.1,
    ),
    _h(
        "l12_skip_late_tp",
        "l12",
        "rank 4 leaves out step 7's TP all_reduce after a long periodic "
        "history, "
        "completes the DP one with ranks 3, 5 and waits in the 12-rank group; rank 1 waits in TP "
        "for it (no "
        "descs)",
        "tp_dp_world",
        9,
        [(4, 7, 0, "skip")],
        {4: "skipped"},
    ),
    _h(
        "l12_pipeline_send",
        "l12",
        "stage-1 rank 8 blocks before sending step 1's gradients back: "
        "rank 2 waits in "
        "recv, rank 5 in TP for rank 2, ranks 6, 7 in DP for rank 8",
        "megatron2",
        3,
        [(8, 1, 3, "stuck")],
        {8: SO},
    ),
    # l16: TP2 x EP2 x DP2 x PP2, Megatron order and descs, groups created in reverse
    _h(
        "l16_two_near",
        "l16",
        "ranks 3 (before its EP all_reduce) and 12 (before its TP all_reduce) block at step 1",
        "moe",
        3,
        [(3, 1, 1, "stuck"), (12, 1, 0, "stuck")],
        {3: SO, 12: SO},
    ),
    _h(
        "l16_chain",
        "l16",
        "rank 0 blocks before step 2's TP all_reduce: rank 1 waits in TP, 3 in "
        "EP for 1, 7 in "
        "DP for 3, 15 in PP for 7",
        "chain4",
        4,
        [(0, 2, 0, "stuck")],
        {0: SO},
    ),
    _h(
        "l16_crash_and_stuck",
        "l16",
        "rank 5 raises before step 2's DP all_reduce while rank 10 "
        "blocks before "
        "step 2's TP all_reduce",
        "moe",
        4,
        [(5, 2, 2, "crash"), (10, 2, 0, "stuck")],
        {5: "crashed", 10: SO},
    ),
    # l16b: TP4 x DP4, TP from new_subgroups (no desc), DP by enumeration, no job-wide group
    _h(
        "l16b_skip_early_tp",
        "l16b",
        "rank 6 leaves out its first TP all_reduce (step 0) and goes "
        "on; with no "
        "job-wide group its TP all_reduces pair with its peers' earlier ones until the last step, "
        "where ranks 4, "
        "5, 7 wait in TP while rank 6 has finished",
        "tp_dp",
        3,
        [(6, 0, 0, "skip")],
        {6: "skipped"},
    ),
    _h(
        "l16b_stuck_dp_step6",
        "l16b",
        "rank 13 blocks before step 6's DP all_reduce",
        "tp_dp",
        8,
        [(13, 6, 1, "stuck")],
        {13: SO},
    ),
    _h(
        "l16b_size_tp",
        "l16b",
        "rank 9 all_reduces its TP tensor (new_subgroups, no desc) as [1, 16] at step 1",
        "tp_dp",
        3,
        [(9, 1, 0, "size")],
        {9: "size_mismatch"},
    ),
    # l8: PP4 x TP2, rank = pp + 4 tp, a 4-stage pipeline
    _h(
        "l8_pipe_fwd_chain",
        "l8",
        "stage-0 rank 0 blocks before sending step 1's activations: "
        "ranks 1, 2, 3 wait "
        "in recv down the pipeline, rank 5 in TP for rank 1, ranks 6, 7 in recv behind it, rank 4 "
        "in recv for "
        "rank 5's gradients",
        "pipeline",
        3,
        [(0, 1, 1, "stuck")],
        {0: SO},
    ),
    _h(
        "l8_pipe_bwd_mid",
        "l8",
        "stage-2 rank 6 blocks before sending step 2's gradients back: "
        "rank 5 waits in "
        "recv, rank 1 in TP for rank 5, ranks 0 and 4 in recv behind them",
        "pipeline",
        4,
        [(6, 2, 5, "stuck")],
        {6: SO},
    ),
    _h(
        "l8_ckpt_world_step6",
        "l8",
        "stage-1 rank 5 blocks in save_checkpoint before step 6's world all_reduce",
        "pipeline",
        8,
        [(5, 6, 6, "checkpoint")],
        {5: SO},
    ),
    # second wave: the families again where the first wave's fixes must hold in other shapes
    _h(
        "l6_two_in_tp",
        "l6",
        "ranks 3 and 4 (one TP group of three) both block before step 1's TP "
        "all_reduce: "
        "rank 5 waits on both",
        "tp_dp_world",
        3,
        [(3, 1, 0, "stuck"), (4, 1, 0, "stuck")],
        {3: SO, 4: SO},
    ),
    _h(
        "l12_skip_early_tp",
        "l12",
        "rank 4 leaves out its first TP all_reduce (step 0, no history; "
        "TP groups "
        "without descs) and waits in the 12-rank group; rank 1 waits in TP for it",
        "tp_dp_world",
        3,
        [(4, 0, 0, "skip")],
        {4: "skipped"},
    ),
    _h(
        "l12_size_tp",
        "l12",
        "rank 10 all_reduces its TP tensor as [1, 16] at step 2 in a group of "
        "two without "
        "a desc (one against one)",
        "tp_dp_world",
        4,
        [(10, 2, 0, "size")],
        {10: "size_mismatch"},
    ),
    _h(
        "l12_two_near_nodesc",
        "l12",
        "ranks 0 and 11 (different TP and DP groups, no descs) block before step 1's DP all_reduce",
        "tp_dp_world",
        3,
        [(0, 1, 1, "stuck"), (11, 1, 1, "stuck")],
        {0: SO, 11: SO},
    ),
    _h(
        "l16_op_ep",
        "l16",
        "rank 6 runs all_gather where its EP peer (rank 4, a group of two) runs "
        "all_reduce at "
        "step 1: both block in it",
        "moe",
        3,
        [(6, 1, 1, "op")],
        {6: "op_mismatch"},
    ),
    _h(
        "l16_invert_step0",
        "l16",
        "rank 9 runs the world all_reduce before its DP all_reduce in "
        "step 0, every "
        "other rank DP first: rank 13 waits in DP for it, it waits in the world group",
        "moe",
        3,
        [(9, 0, 2, "invert")],
        {9: "skipped"},
    ),
    _h(
        "l16b_size_then_stuck",
        "l16b",
        "rank 2's DP all_reduce of step 0 has another shape "
        "(completes), and at "
        "step 3 rank 12 blocks before its TP all_reduce: two independent roots",
        "tp_dp",
        5,
        [(2, 0, 1, "size"), (12, 3, 0, "stuck")],
        {2: "size_mismatch", 12: SO},
    ),
    _h(
        "l16b_skip_early_dp",
        "l16b",
        "rank 6 leaves out its first DP all_reduce (step 0, the "
        "step's last "
        "collective) and goes on; its DP all_reduces pair with its peers' earlier ones until the "
        "last step, where "
        "ranks 2, 10, 14 wait in DP while rank 6 has finished",
        "tp_dp",
        3,
        [(6, 0, 1, "skip")],
        {6: "skipped"},
    ),
    _h(
        "l8_healthy",
        "l8",
        "no fault: the 4-stage pipeline's sends and receives all complete",
        "pipeline",
        3,
        [],
    ),
    # third wave: other collectives (programs fsdp, moe_a2a, scatter_tp, barrier_dp)
    _h(
        "l16_fsdp_stuck_rs",
        "l16",
        "rank 5 blocks before step 2's DP reduce_scatter_tensor (FSDP's "
        "gradient "
        "reduce): rank 1 waits in it",
        "fsdp",
        4,
        [(5, 2, 2, "stuck")],
        {5: SO},
    ),
    _h(
        "l16_fsdp_stuck_ag",
        "l16",
        "rank 14 blocks before step 1's DP all_gather_into_tensor (FSDP's parameter gather)",
        "fsdp",
        3,
        [(14, 1, 1, "stuck")],
        {14: SO},
    ),
    _h(
        "l16_a2a_stuck",
        "l16",
        "rank 6 blocks before step 1's second EP all_to_all_single (MoE "
        "combine): rank 4 "
        "waits in it",
        "moe_a2a",
        3,
        [(6, 1, 2, "stuck")],
        {6: SO},
    ),
    _h(
        "l6_scatter_nonroot",
        "l6",
        "rank 4 blocks before step 2's TP scatter, whose root (rank 3) "
        "sends and goes "
        "on into DP; rank 5 receives",
        "scatter_tp",
        4,
        [(4, 2, 0, "stuck")],
        {4: SO},
    ),
    _h(
        "l6_scatter_root",
        "l6",
        "the root of a TP scatter (rank 3) blocks before step 1's: ranks 4, 5 wait in it",
        "scatter_tp",
        3,
        [(3, 1, 0, "stuck")],
        {3: SO},
    ),
    _h(
        "l12_barrier_dp",
        "l12",
        "rank 7 blocks before step 3's DP barrier (no descs)",
        "barrier_dp",
        5,
        [(7, 3, 1, "stuck")],
        {7: SO},
    ),
    # phase 2: a SIGKILL ends the process for every scenario
    _h(
        "l12_sigkill",
        "l12",
        "rank 9 is SIGKILLed before step 2's DP all_reduce and writes no dump",
        "tp_dp_world",
        4,
        [(9, 2, 1, "kill")],
        {9: "missing_dump"},
        phase=2,
    ),
)
DEFAULT_SCENARIOS: tuple[HeldoutScenario, ...] = (
    _h("l4_default_stuck", "l4", "a job with only the default group: rank 2 blocks before step 3's "
                                 "broadcast "
       "(root 0)", "default", 5, [(2, 3, 1, "stuck")], {2: SO}),
    # phase 2, on the same four processes (groups of its own): the default group stays stuck behind
    # phase 1
    _h("l4p_pipe_sigkill", "l4p", "a 4-stage pipeline alone: stage-2 rank 2 is SIGKILLed before "
                                  "sending step 1's "
       "activations on and writes no dump: rank 3 waits in recv for it, ranks 1 and 0 in recv for "
       "the gradients",
       "pipeline_only", 3, [(2, 1, 1, "kill")], {2: "missing_dump"}, phase=2),
)

MAIN = SimpleNamespace(WORLD_SIZE=16, SCENARIOS=MAIN_SCENARIOS)
DEFAULT_ONLY = SimpleNamespace(WORLD_SIZE=4, SCENARIOS=DEFAULT_SCENARIOS)
#: (suite, how worker.py loads it)
SUITES = ((MAIN, "tests.torch_jobs.hang_heldout.scenarios:MAIN"),
          (DEFAULT_ONLY, "tests.torch_jobs.hang_heldout.scenarios:DEFAULT_ONLY"))
SCENARIOS = MAIN_SCENARIOS + DEFAULT_SCENARIOS
BY_NAME = {s.name: s for s in SCENARIOS}
