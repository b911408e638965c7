"""Goodput accounting: ETTR (effective training time ratio) and badput by cause for one job, from
the store.

ETTR (Meta's definition, reference/failures.md 2(b)) is productive training time divided by the
wall-clock time of the window. Badput is the rest, broken down by cause. Every instant of the window
[start, end] gets exactly one bucket, so the buckets add up to the wall clock. Where the definitions
below overlap, the bucket that comes first in PRIORITY wins (e.g. a straggler's detection runs while
steps still complete: those seconds are productive).

Facts read from the store (one job; rows with a null attempt count as attempt 0):

- A *step* is one (attempt, step number, phase) of the `steps` table, spanning from the earliest
  `start_ts` to the latest `end_ts` over the ranks (synchronous training: every rank spends the step
  together).
- An attempt's *start* is its earliest `process_events` row of kind 'start' (the supervisor's
  launch), else its earliest `ranks` row (the step timer's start, after init_process_group), else
  its first step's start; a caller that knows better (the supervisor launched the attempt earlier)
  passes `attempt_starts`, and the earlier time is used.
- An attempt's *resume point* is the smallest first step number (non-checkpoint phases) of any later
  attempt: the step the job went back to. The last attempt has none.
- An incident is one `incident_id` of the `incidents` table (first_signal_ts, detected_ts: earliest
  over its rows); a decision is one `decision_id` of the `decisions` table (issued_ts: its earliest
  row). A decision belongs to the attempt on its row, else its incident's.
- Only *live* incidents and decisions shape the timeline: detected (issued) no later than the start
  of the next attempt after theirs, or, for the last attempt, within `live_grace_s` (default 600 s)
  of the job's last telemetry. The others come from a batch pass over old telemetry (`faultlens
  attribute` after the fact, a simulated store): their detection and decision times say when the
  pass ran, not what the job waited for. They are listed in `offline`, still charged in the
  per-incident costs, and the time they would have covered is whatever else covers it (often
  `unknown`).

Buckets (seconds), in priority order:

- checkpoint: inside a step row of phase 'checkpoint' (blocking checkpoint save), whether or not
  that checkpoint was later restored.
- lost_work: inside a non-checkpoint step of attempt k whose step number is >= attempt k's resume
  point: computed, then thrown away because a later attempt recomputed it. The partial step in
  progress when a failure hit has no step row; it falls in `unknown`.
- productive: inside any other non-checkpoint step (train, eval, warmup, user phases): work that was
  kept. The last attempt's steps are kept (nothing has thrown them away yet, even when the job was
  escalated).
- startup: from an attempt's start to its first step's start (process start-up, rendezvous, model
  build, checkpoint load). An attempt that never reached a step: to the first signal of its first
  incident, else to the next attempt's start (or the window's end).
- restart (shutdown and restart): from a decision's issued_ts to the start of the next attempt (the
  smallest attempt number above the decision's with a start at or after issued_ts); with no next
  attempt, to the window's end (the job waits for a human).
- decision: from an incident's detected_ts to the issued_ts of its first decision (policy, restore
  choice; a controller that stops the job before it asks for a decision, as the reference supervisor
  does, spends its shutdown here).
- detection: from an incident's first_signal_ts to its detected_ts.
- unknown: the unproductive remainder: gaps between step rows, the unfinished step when a failure
  hit, time before the first attempt's start when the window starts earlier, anything no rule above
  covers.

The window is [since, until] when given, else [earliest attempt start, latest activity], where the
latest activity is the latest of: a step's end, a process event, a ranks row, a live incident's
detection, a live decision.

Over the bucket timeline: ETTR = productive / wall; sliding-window ETTR = productive seconds in (t -
W, t] / W for sample times t from start + W to end (W defaults to a tenth of the wall clock); the
longest unproductive stretch is the longest run of time containing no productive second. An incident
that stopped an attempt (the one of that attempt's first decision) is charged with the attempt's
lost work plus every unproductive second from the attempt's last step end to the next attempt's
first step (or the window's end).

A straggler's slowdown is not badput here: its slow steps are productive (or lost work when thrown
away).
"""

from __future__ import annotations

from faultlens.attribution.goodput.accounting import (
    account,
    expected_ettr,
    goodput,
    optimal_checkpoint_interval,
)
from faultlens.attribution.goodput.buckets import BADPUT, BUCKETS, PRIORITY, Bucket, GoodputError
from faultlens.attribution.goodput.facts import DecisionFact, IncidentFact, JobFacts, load_job_facts
from faultlens.attribution.goodput.report import (
    AttemptAccount,
    GoodputReport,
    IncidentCost,
    Stretch,
    WindowPoint,
)
from faultlens.attribution.goodput.timeline import Timeline, build_timeline

__all__ = [
    "BADPUT",
    "BUCKETS",
    "PRIORITY",
    "AttemptAccount",
    "Bucket",
    "DecisionFact",
    "GoodputError",
    "GoodputReport",
    "IncidentCost",
    "IncidentFact",
    "JobFacts",
    "Stretch",
    "Timeline",
    "WindowPoint",
    "account",
    "build_timeline",
    "expected_ettr",
    "goodput",
    "load_job_facts",
    "optimal_checkpoint_interval",
]
