"""Crash attribution: the primary failure of an attempt among all the ranks' error signals, and its
cause.

One attempt of a job ends in one crash incident, however many lines its ranks wrote: the survivors'
echoes ("Connection closed by peer", collective timeouts, SIGTERM from torchrun) are folded into it
as a count. The primary failure is the rank that failed first on its own (an exception or OOM that
is not an echo, a death by signal, else an unexplained non-zero exit), never a survivor, even when
torchrun's Root Cause names one. Its cause:

1. the same traceback fingerprint on ranks of different nodes -> software;
2. the same fingerprint at the same step in an earlier attempt -> software (deterministic repeat);
3. hardware GPU events on the culprit's node near the failure (XID by catalog component, DBE, GPU
   lost, ...);
4. the same fingerprint in an earlier attempt at another step -> software (not for a known
   network/hardware error text: those fail in the same call wherever a link dies);
5. a known signature in rules/crash.yaml (CUDA OOM, ECC error text, NCCL network error, ...);
6. otherwise: an exception -> software (low confidence); a signal or bare exit -> unknown.

An attempt whose only error signals are collective timeouts has no crash: it is handed to hang
analysis. An attempt whose first failure says a peer's message did not match its collective
(rules/crash.yaml `mismatch_patterns`) is no crash of that rank either: the job desynchronised
(attribution/detectors/desync.py).

Lifecycle: what the supervisor did is never a failure. Its `signal_sent` process_events rows mark
the start of an attempt's teardown; every failure row from then on (and every death by a signal it
sent) is a termination, as are the texts of rules/crash.yaml `termination_patterns` (torchrun's
SignalException when its agent is stopped). "From then on" is at each row's own resolution: torch's
error files and torchrun's report stamp whole seconds, so such a row counts from the teardown's
second on (an echo written after the SIGTERM reads .000, before it). An attempt whose failures are
all terminations has no crash. Node loss: a node whose torchrun agent died by a signal the
supervisor did not send (its `agent_exit` row) and whose ranks have no failure of their own is a
host crash of that node (its ranks alive after it: the agent alone was lost); with no agent report,
every rank of one node silent while the others echoed the loss is one too. A death by signal has an
identity, `<signal>@rank<r>`, in the fingerprint column, so the same signal killing the same global
rank again on another node is a repeat (software). The step of a death is the last completed step +
1 (the heartbeat's, else the step rows').

Modules: failures (the public types), rows (one process_events row: its signal, a death's identity,
in words), lifecycle (what the supervisor recorded: the teardown, the agents started, exited and
lost), liveness (the ranks' own progress: closed step timers, heartbeats after a failure, the step
of a death), classify (row and rank level: failure rows, echoes, one RankFailure per rank, the
primary), attributor (CrashAttributor: the attempt level), cause (the cause of a primary failure and
its incident), nodes (attempts with no primary of their own: node loss, hardware with no report,
hangs, no primary seen).
"""

from faultlens.attribution.detectors.crash.attributor import CrashAttributor
from faultlens.attribution.detectors.crash.failures import (
    FAILURE_KINDS,
    PRIMARY_KINDS,
    SIGNALS_BY_NUMBER,
    WAIT,
    CrashResult,
    FailureKind,
    HangTrigger,
    RankFailure,
)
from faultlens.attribution.detectors.crash.lifecycle import (
    TEARDOWN_SIGNALS,
    ended_agents,
    lost_agents,
    running_agents,
    teardown_starts,
)
from faultlens.attribution.detectors.crash.liveness import closed_ranks, death_step, last_progress
from faultlens.attribution.detectors.crash.rows import (
    describe_process_event,
    signal_identity,
    signal_of,
)

__all__ = [
    "FAILURE_KINDS",
    "PRIMARY_KINDS",
    "SIGNALS_BY_NUMBER",
    "TEARDOWN_SIGNALS",
    "WAIT",
    "CrashAttributor",
    "CrashResult",
    "FailureKind",
    "HangTrigger",
    "RankFailure",
    "closed_ranks",
    "death_step",
    "describe_process_event",
    "ended_agents",
    "last_progress",
    "lost_agents",
    "running_agents",
    "signal_identity",
    "signal_of",
    "teardown_starts",
]
