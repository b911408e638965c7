"""The hang report's public types: verdict kinds, one root, the report; the shared patterns and
columns.
"""

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class HangVerdict(StrEnum):
    NO_HANG = "no_hang"
    NEVER_JOINED = "never_joined"
    STALLED = "stalled"
    SIZE_MISMATCH = "size_mismatch"
    OP_MISMATCH = "op_mismatch"
    MISSING_DUMPS = "missing_dumps"
    # never joined, and inside no collective at all (a root's kind only)
    STUCK_OUTSIDE = "stuck_outside"
    SKIPPED = "skipped"  # left the collective out and went on (a root's kind only)
    CYCLE = "cycle"  # waits on the others of a cycle nothing could order (a root's kind only)
    # a mismatch every member completed: no hang, a silent desync (never a failover on its own)
    COLLECTIVE_MISMATCH = "collective_mismatch"
    UNKNOWN = "unknown"


#: a completed mismatch's confidence: below the policy's failover threshold (rules/policy.yaml
#: confidence_threshold), so it never fails a node over on its own
COMPLETED_MISMATCH_CONFIDENCE = 0.5
#: the most a rank without a dump is named at where ranks that dumped wait on it (its absence is
#: the evidence: above the failover threshold, never as high as a rank whose own dump or stack
#: shows it: 0.95)
MISSING_DUMP_CONFIDENCE = 0.85


#: the coarse report-level family of each root kind (report.verdict keeps the families the decision
#: rules know)
VERDICT_FAMILY = {
    HangVerdict.STUCK_OUTSIDE: HangVerdict.NEVER_JOINED,
    HangVerdict.SKIPPED: HangVerdict.NEVER_JOINED,
    HangVerdict.CYCLE: HangVerdict.NEVER_JOINED,
}


@dataclass(frozen=True)
class HangRoot:
    """One independent root cause: the ranks that others wait on (directly or through other ranks),
    what they did, where, and who waits on them."""

    kind: HangVerdict
    ranks: tuple[int, ...]
    kinds: tuple[tuple[int, str], ...]  # per rank: its own kind (a root of two ranks may mix them)
    pg_id: str | None
    pg_name: str | None
    pg_desc: str | None
    collective_seq_id: int | None
    op: str | None
    waiting_ranks: tuple[int, ...]  # every rank whose lag is explained by waiting on this root
    where: tuple[str, ...]  # per rank, where its Python stack says it is (when stacks were given)
    confidence: float
    reason: str
    # the chain: the root's own divergences first, then the ranks waiting on it
    evidence: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "ranks": list(self.ranks),
            "kinds": {str(r): k for r, k in self.kinds},
            "pg_id": self.pg_id,
            "pg_name": self.pg_name,
            "pg_desc": self.pg_desc,
            "collective_seq_id": self.collective_seq_id,
            "op": self.op,
            "waiting_ranks": list(self.waiting_ranks),
            "where": list(self.where),
            "confidence": self.confidence,
            "reason": self.reason,
            "evidence": list(self.evidence),
        }


@dataclass(frozen=True)
class HangReport:
    verdict: HangVerdict
    culprit_ranks: tuple[int, ...]
    pg_id: str | None
    pg_name: str | None
    pg_desc: str | None
    collective_seq_id: int | None
    op: str | None
    never_joined: tuple[int, ...]
    stalled: tuple[int, ...]
    missing_dumps: tuple[int, ...]
    reason: str
    confidence: float
    evidence: tuple[str, ...]
    # every independent root; the fields above describe roots[0] (the headline)
    roots: tuple[HangRoot, ...] = ()
    follow_ons: tuple[int, ...] = ()  # ranks whose lag is explained by waiting on a root
    # a cycle no information could order was reported whole (low confidence)
    unresolved_cycle: bool = False
    # ranks without a dump that ranks which dumped wait on (named or not)
    waited_missing: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "culprit_ranks": list(self.culprit_ranks),
            "pg_id": self.pg_id,
            "pg_name": self.pg_name,
            "pg_desc": self.pg_desc,
            "collective_seq_id": self.collective_seq_id,
            "op": self.op,
            "never_joined": list(self.never_joined),
            "stalled": list(self.stalled),
            "missing_dumps": list(self.missing_dumps),
            "reason": self.reason,
            "confidence": self.confidence,
            "evidence": list(self.evidence),
            "roots": [r.to_dict() for r in self.roots],
            "follow_ons": list(self.follow_ons),
            "unresolved_cycle": self.unresolved_cycle,
            "waited_missing": list(self.waited_missing),
        }


# ops whose input shapes must agree on every member (others: all_to_all, scatter/gather roots,
# coalesced, p2p)
SHAPE_MUST_MATCH = re.compile(
    r":(all_reduce|allreduce|_allreduce_base|broadcast|reduce|all_gather|allgather|"
    r"_all_gather_base|all_gather_into_tensor|reduce_scatter|_reduce_scatter_base|"
    r"reduce_scatter_tensor|barrier)(_coalesced)?$"
)
# ops whose input only the root holds (scatter): the other members' empty input lists say nothing of
# dtypes
INPUT_AT_ROOT_ONLY = re.compile(r":scatter$")
# ops whose output only the root holds (gather): the other members' empty output lists say nothing
# of dtypes
OUTPUT_AT_ROOT_ONLY = re.compile(r":gather$")
# the columns an entry's signature reads besides its op: outputs compared like inputs (an uneven
# broadcast or an all_gather into another shape shows in them)
SIGNATURE_COLUMNS = ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes")
P2P_OP = re.compile(r"(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)")
COLUMNS = (
    "rank",
    "pg_id",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "record_id",
    "collective_seq_id",
    "p2p_seq_id",
    "is_p2p",
    "op",
    "state",
    "retired",
    "time_created",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
)
MAX_EVIDENCE = 24


