"""Straggler detection from per-rank compute-section timings, decomposed over the job's parallel
coordinates, with the what-if cost of each slowdown and the GPU signals that explain a slow GPU.

Synchronous training makes every rank's step wall time the same, so only a rank's own work (the
sections the vocabulary of rules/comm_ops.yaml calls compute or data; communication is waiting,
unknown sections are reported and never scored) says who is slow. Per step, compute is decomposed
(attribution/detectors/straggler/decompose.py) into
- a stage effect: a pipeline stage slow in every replica -> one systemic incident
  (workload_imbalance: layers or a loss head), notified, no node excluded;
- a replica effect: every stage of one replica slow -> the replica, and what it shares (its node
  when it holds one, else the switch or network its nodes share);
- a worker effect: a rank slow against the same place in the other replicas (or its own history with
  one replica) -> that rank's node (or the whole node when most of its ranks are slow); the cause
  from its GPU samples (thermal bits 0x20/0x40, power brake 0x80, hot, clocks down relative to
  peers) or gpu_events, else unknown;
- slow workers on many nodes, or slow outliers that move between ranks from step to step
  (data-dependent imbalance) -> workload_imbalance, no node to blame.
A finding is persistent: slow in at least `persistence` of a window of steps; one-off slow steps and
evaluation steps never count. Every finding carries its what-if
(attribution/detectors/straggler/whatif.py): the step time if the culprit ran at its peers' speed,
"fixing this saves N% of step time"; a finding that would save less than min_step_slowdown raises
nothing. Evidence cites only the tables that hold it, and confidence counts only what was used.
Per-node multi-metric vectors (compute ratio, and SM clock, temperature, power, throttle share where
GPU samples exist) are scored with a robust covariance estimate (scikit-learn MinCovDet) when the
job spans enough nodes.

Modules: report (the public types: StepScores, Remaining, StragglerFinding; the shared constants),
sections (section timing: which columns are own work, own_time, the (step x rank) frames,
StepScores), persistence (the persistence and window logic), costs (a finding's what-if and the
baselines its sections are compared with), findings (stage, replica, worker, systemic and moving
findings), evidence (timing evidence, own history, details, worker confidence), cause (cause
classification from GPU samples and gpu_events; robust node outliers), incidents (a finding into an
Incident), detector (StragglerDetector, the entry point the engine uses).
"""

from faultlens.attribution.detectors.straggler.decompose import robust_z
from faultlens.attribution.detectors.straggler.detector import StragglerDetector
from faultlens.attribution.detectors.straggler.report import (
    MAX_PEER_NODES,
    SYNC_OPS,
    SYSTEMIC_MIN_NODES,
    UNKNOWN_SHARE_REPORTED,
    Remaining,
    StepScores,
    StragglerFinding,
    remaining_time,
)
from faultlens.attribution.detectors.straggler.sections import own_time

__all__ = [
    "MAX_PEER_NODES",
    "SYNC_OPS",
    "SYSTEMIC_MIN_NODES",
    "UNKNOWN_SHARE_REPORTED",
    "Remaining",
    "StepScores",
    "StragglerDetector",
    "StragglerFinding",
    "own_time",
    "remaining_time",
    "robust_z",
]
