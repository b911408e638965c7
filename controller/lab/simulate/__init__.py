"""Cluster simulator: a labelled fault corpus written through the real sink (fault injection, like
the demo's).

    from faultlens.controller.lab.simulate import SimConfig, simulate
    result = simulate(SimConfig(nodes=16, hours=24, seed=1), "store-dir")

Modules: config (settings), kind_names (the fault kinds a fault_sequence may name, below config),
cluster (nodes, GPUs, rank placement), timing (steps and sections), gpu (NVML samples and derived
events), xid (kernel-log Xid lines), process (exceptions, exits, secondary echoes), collectives
(flight-recorder dumps of hangs), faults (the Llama 3 mix and its injectors), noise (benign noise),
world (shared state), run (the driver).
"""

from faultlens.controller.lab.simulate.config import ConfigError, SimConfig
from faultlens.controller.lab.simulate.run import SimulationResult, default_labels_path, simulate

__all__ = ["ConfigError", "SimConfig", "SimulationResult", "default_labels_path", "simulate"]
