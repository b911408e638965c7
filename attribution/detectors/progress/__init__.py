"""Hang detection from progress, and the collective-hang incident built from a flight-recorder dump
set.

A job is suspected hung when no step of its current attempt completes for k x its recent step time
(the median interval between consecutive completed training steps, warm-up steps left out), never
before a floor, and only after a much longer floor while no baseline exists yet (the first steps of
an attempt). Phases that are slow by design (evaluation, checkpointing) widen the allowance once
seen, when the next step may be one of them; not while every rank sits idle together (together.py:
no rank began or completed a step, and none used CPU or moved bytes, over the normal threshold: the
peers are blocked and so is the rank they wait for). An earlier attempt counts as hung when its
progress stopped that long before the next attempt started.

Progress is read from the heartbeats table (the step counter each rank's step timer publishes at
every step, collectors/training/heartbeat.py) as well as from the step rows, so a long flush
interval never reads as a stall. Job lifecycle: an attempt has ended, and is never judged, when
every rank exited 0 (process_events exit rows), when every torchrun agent exited 0 (the supervisor's
agent_exit rows), or when every rank's step timer closed; while no rank is inside a step (the
training loop is over and the ranks tear down, or all wait between steps) only the startup floor
counts as a stall.

A suspect (from progress, or from collective-timeout errors in process_events) then gets a
flight-recorder dump request through a callable the caller passes in, and the dump set's collectives
go through the hang analysis (faultlens.attribution.detectors.hang.analyze_collectives). Its culprit
ranks are mapped to nodes and GPUs through the ranks table.
"""

from __future__ import annotations

from faultlens.attribution.detectors.progress.dumps import (
    HangAttributor,
    latest_dump_set,
    suspect_from_trigger,
)
from faultlens.attribution.detectors.progress.monitor import ProgressBaseline, ProgressMonitor
from faultlens.attribution.detectors.progress.suspect import (
    DumpRequester,
    HangAnalyzer,
    HangSuspect,
    default_analyzer,
)

__all__ = [
    "DumpRequester",
    "HangAnalyzer",
    "HangAttributor",
    "HangSuspect",
    "ProgressBaseline",
    "ProgressMonitor",
    "default_analyzer",
    "latest_dump_set",
    "suspect_from_trigger",
]
