"""Collective-hang analysis over flight-recorder rows: which rank(s) the job is waiting for, in
which group and collective, and why.

How the answer is reached
-------------------------
1. **Groups and members.** Entries are grouped by process-group *name* (`process_group[0]`, the same
   on every rank; `pg_id` is rank-local). Members come from `pg_ranks` (the dump's `pg_config`).
   Where that is broken (gloo keys it '' with ranks '[]', groups overwrite each other) membership is
   rebuilt from the entries: the ranks that recorded the group, plus every expected rank for the
   default group. Expected ranks are `expected_ranks`, else every rank named by a group, else
   0..highest rank seen. Expected ranks with no dump are *missing dumps* (a SIGKILLed rank writes
   none; a healthy rank's dump may be lost or late): nodes of the wait graph below, and evidence.
   Ranks wait on them only where they are inside a collective of a group the missing rank shares, or
   stopped right after its latest collective (gloo retires the entry a dead peer broke; a stack
   showing the process gone confirms it), and no member that dumped explains that wait (waits.py). A
   root of missing ranks that may itself be waiting (it shares a group with another root's ranks or
   waiters, its stack shows it blocked, a rank beside it is seen stuck in its own code, or a rank
   waiting on it skipped a collective they share) is noted, not named (missing_roots.py); what the
   dumps cannot tell apart is named below any failover. Ranks without a dump whose own exits say
   they waited (`timed_out`: "Timed out waiting", or the echo of a peer's exit) are never culprits
   by absence: a rank that dumped and stopped in its own code is what they waited on. A group only
   one rank recorded (gloo's raw pg_config) is tried with each member the ranks' local
   process-group ids allow; an answer every such membership gives stands (unseen_members.py).
2. **Per group, match by sequence id.** For each member: E = the highest `collective_seq_id` it
   entered, C = the highest it completed in order (everything below its first incomplete entry;
   `state == completed` or `retired`), S = the highest it started. p2p entries are matched
   separately, per pair of peers by `p2p_seq_id`.
   - E differs: the first divergent collective is min(E)+1; members at min(E) *never joined* it,
     members above wait for them.
   - else C differs: members at min(C) *joined and stalled* (they entered it, their peers completed
     it);
   - else S differs: members that have not started it while the others have are behind;
   - else every member entered the same last collective: none completed -> the whole group is stuck
     together.
   Each divergence is an edge "waiter -> laggard" of a wait-for graph over ranks (through one node
   per divergence, so a 16,384-rank group costs 16,384 edges, not 16,384^2).
3. **Independent roots (root causes vs follow-ons).** In a job with tensor/data/expert/pipeline
   groups one stuck rank makes its peers wait in the group they share, and those peers make *their*
   peers wait in other groups. Each of those shows up as a divergence, but only ranks that wait on
   *nobody* are root causes: every terminal strongly-connected component of the wait-for graph
   (nothing it waits on) that others wait on is a root, with its own group, collective, evidence
   chain and the ranks that wait on it (reverse reachability), however far apart in time the roots
   are. Follow-ons are exactly the ranks that reach a root. A rank that joined a collective its own
   group's peers completed (stalled inside it) is a root whatever it waits on elsewhere (its later,
   enqueued work waits behind the stall); its out-edges are dropped. Stacks
   (collectors/sources/pystack.py, py-spy): a rank blocked in a send/recv gloo does not record waits
   on its peer: one more edge. A stuck rank's frame is evidence ("rank 3 is in
   DataLoader.__next__"). Without stacks, on gloo, a rank blocked in such a send/recv looks stuck in
   its own code; a laggard whose stack is blocked in the op its peers wait in waits too, on the
   other laggards or the group's ranks without a dump, else on the one other root (blocked.py);
   where two or more ranks stopped
   that way, their roots stand uncertain (any may wait
   on another: hidden_p2p.py), below the policy's failover threshold; so does one whose own exit
   says it timed out waiting (`timed_out`): it waited in a send/recv on a rank no dump names.
4. **Cycles.** A cycle (rank 2 waits for rank 3 in a sub-group while rank 3 waits for rank 2 in the
   world group) arises when one rank *skipped* a collective, or ran two in another order. Broken
   first by each rank's own cross-group entry order (record order): for a cycle member that lags in
   group G at seq k, the collectives it entered after its last G entry are compared with the order
   in which the ranks outside the cycle entered the same collectives (in the groups of the same
   part: same desc and size, e.g. the other TP groups): if they entered G's seq k first, the member
   went past it - it skipped (root). No periodic history is needed. Then by program-order prediction
   where the member's own history is periodic (the point where its next collective of group H was
   due relative to its sequence in group K). A skipper's out-edges are dropped and the components
   recomputed. A cycle that also waits on ranks outside it (e.g. ranks gloo shows silent) is checked
   the same way (a cycle is an order inversion wherever it lies). A cycle nothing can order is
   reported whole, kind `cycle`, confidence 0.5 (below the policy's threshold: never a failover).
   Groups without a desc ('undefined': new_group / new_subgroups without group_desc) play the part
   of their creation run: consecutive counter names, one size, disjoint (skips.py creation_runs). A
   skip need not close a cycle (with no later collective that needs the waiting peers, the skipper's
   later collectives pair with its peers' earlier ones until it is done): a terminal rank alone is
   checked by the same consensus, and is `skipped` where it went past the collective.
5. **Mismatches.** At each (group, sequence id) the entries of all members are compared: op name,
   dtypes and, for ops whose shapes must agree (all_reduce, broadcast, reduce, all_gather,
   reduce_scatter, barrier), the sizes, of inputs and outputs alike (an uneven broadcast, an
   all_gather into another shape). The ranks outside the majority are the odd ones (gloo
   even completes an all_reduce of equal element count but different shape; only the trace shows
   it). A mismatch is its own root, or evidence of the root its odd ranks belong to (the root's
   headline when earlier than its divergence); a tie is decided by the roots the graph found; a
   follow-on only when its odd ranks were already waiting on a root when they made it. A tie (one
   against one in a group of two) is first broken by the same collective of the groups playing the
   same part, else by the group's neighbouring collectives: the side that matches what the others
   agree on is the majority. In a group whose other members wrote no dump, the present members'
   collective is compared with what every other group of its part called at that sequence id
   (partners.py; unanimity only). A mismatched collective the group is stuck in (all entered, none
   went past: all_gather against all_reduce) makes its majority wait on the odd ranks (divergence
   level `mismatch`): the odd ranks are the root, with the mismatch's kind, and the majority
   follow-ons. A mismatch every member went past (entered a later collective of the group, or
   completed it) that nobody waits on is kind `collective_mismatch`: no hang, a silent desync, at a
   confidence below the policy's failover threshold; beside a hang it is listed after the hang's
   roots and names none of its culprits.
6. **Kinds** (HangRoot.kind; the report's `verdict` keeps the coarse family): never_joined,
   stuck_outside (never joined and inside no collective: every entry it recorded completed, or its
   stack is in user code), skipped, stalled, size_mismatch, op_mismatch, collective_mismatch,
   missing_dumps, cycle.
   Confidence: the lowest of the roots'.

On the real NCCL set (tests/data/nccl-fr-gpu_error_2nd: 16 ranks, TP/DP/EP/PP groups, GPU errors on
ranks 9 and 14): in TENSOR_MODEL_PARALLEL_GROUP '37' ranks 8, 10, 11 entered up to 87771 while rank
9 stopped at 87760 (and never completed 87749 onwards, which its peers did); '38' shows the same for
rank 14; the expert, data and context groups spanning ranks 8-15 show 9 and 14 behind as well;
pipeline p2p shows stage-0 ranks (1, 6) ahead of 9 and 14. Ranks 0-7 wait only through p2p and lag
nowhere; ranks 8, 10-13, 15 lag nowhere. The terminal components are {9} and {14}: exactly the two
faulty ranks, never the ranks that merely wait on them. On the real gloo sub-group hang (tests:
torch_artifacts 'subgroup_hang'), rank 2 waits for rank 3 in the pair group while ranks 0, 1, 3 wait
for rank 2 in the world group: a cycle {2, 3}; rank 3's history (pair collective k after world
collective k) shows it entered world seq 5 where pair seq 4 was due, so rank 3 is the skipper and
rank 2 a follow-on. The hang corpus (tests/torch_jobs/hang_corpus: 23 real 8-rank gloo dump sets)
and bench/bench_hang_accuracy.py measure the rest; tests/torch_jobs/hang_heldout holds 30 real gloo
sets of other shapes (4 to 16 ranks, other rank orders, groups without descs or from new_subgroups,
a 4-stage pipeline, the default group alone); tests/data/skip-before-history holds skips of a
sub-group's first collective (no history of it on the skipper: its own order against the others'
decides), a pair's, and chains through two and three sub-groups, raw and repaired, 4 and 8 ranks.

Scale: the table is read in slices (SLICE_ROWS); pass 1 keeps only per-(group, rank) progress and
per-(group, seq) signature extremes, in compiled hash tables filled as each slice is decoded
(aggregate.py), pass 2 fetches the rows of the few keys that need detail. 16,384 ranks x 2,000
entries is ~33 M rows; see bench/bench_hang.py. Below decode.COMPILE_ROWS rows the kernels run as
plain Python (faultlens/compiled.py) and the wait-for graph is split without scipy: a small job's
hang is read and analysed without loading numba, scipy or pandas, nor pyarrow.compute or numpy.ma
(small.py; bench/bench_small_start.py).

from __future__ import annotations


Modules: report (the public types), columns and decode (the table in dense codes, in slices),
kernels (compiled row signatures and decode steps), aggregate (pass 1's hash tables), graph (the
wait-for graph's parts), pass_one (pass 1 slice by slice: what the analysis and the stream share),
analyze (analyze_collectives: the two passes), details (the second pass' per-key detail), partners
(mismatches a lost dump hides), waits (the waits on ranks without a dump), roots (deciding the
independent roots), missing_roots (which roots of ranks without a dump stand), skips (breaking
cycles: who skipped a collective), blocked (laggards whose stacks wait in the op their peers wait
in), unseen_members (groups only one rank recorded: the answer every membership allowed gives),
describe (a root's kind, evidence and confidence; the report),
stacks (Python stacks carried in the table's metadata), small (takes of a few rows and distinct
values without Arrow's compute kernels or numpy.ma), stream (pass 1 on the reader's chunks while
the rest are read; controller/hang_dump_dir.py reads and analyses a directory that way).
"""

from faultlens.attribution.detectors.hang.analyze import analyze_collectives
from faultlens.attribution.detectors.hang.decode import SLICE_ROWS
from faultlens.attribution.detectors.hang.report import (
    COLUMNS,
    MAX_EVIDENCE,
    HangReport,
    HangRoot,
    HangVerdict,
)
from faultlens.attribution.detectors.hang.stacks import (
    STACKS_METADATA_KEY,
    attach_stacks,
    stacks_from_metadata,
)
from faultlens.attribution.detectors.hang.stream import PassOneStream

__all__ = [
    "COLUMNS",
    "MAX_EVIDENCE",
    "SLICE_ROWS",
    "STACKS_METADATA_KEY",
    "HangReport",
    "HangRoot",
    "HangVerdict",
    "PassOneStream",
    "analyze_collectives",
    "attach_stacks",
    "stacks_from_metadata",
]
