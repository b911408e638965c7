"""Step and section timing of a synchronous data/tensor/pipeline-parallel job, as the step timer
records it.

One row per rank per step; sections data, forward, backward, optimizer, comm (plus checkpoint on
checkpoint steps, and eval rows for evaluation passes). The step wall time is shared by all ranks
(synchronous training): a slow rank makes everybody's step longer, but only its *compute* sections
grow; the others wait, which shows up in their comm section. Tensor-parallel peers (one node) wait
for each other inside forward/backward, so a slow GPU slows its whole node's compute sections; a
slow pipeline stage slows the compute of every rank of that stage.

Jitter: lognormal per rank and step, a persistent per-GPU speed (the silicon lottery), a 1-2%
diurnal swing, a slow first step and warm-up after every (re)start, blocking checkpoint saves and
periodic evaluation passes.

Modules: records (Slowdown, Spike, LossEffect; AttemptSteps), chunk (the timer's working state:
layout, slowdown multiplier, cursor, a chunk of draws, spikes), tables (the steps table rows:
sections and loss), timer (StepTimer).
"""

from faultlens.controller.lab.simulate.timing.records import (
    NS,
    AttemptSteps,
    LossEffect,
    Slowdown,
    Spike,
    SpikeHit,
)
from faultlens.controller.lab.simulate.timing.tables import TOKENS_PER_RANK_STEP, TRAIN_SECTIONS
from faultlens.controller.lab.simulate.timing.timer import StepTimer

__all__ = [
    "NS",
    "TOKENS_PER_RANK_STEP",
    "TRAIN_SECTIONS",
    "AttemptSteps",
    "LossEffect",
    "Slowdown",
    "Spike",
    "SpikeHit",
    "StepTimer",
]
