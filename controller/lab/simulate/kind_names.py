"""The names of the fault kinds the simulator injects: what SimConfig.fault_sequence may name.

The settings (config.py) are below the world the injectors change (world.py) and the injectors are
below the catalog (faults/catalog.py), so config cannot ask the catalog which kinds there are
without an import circle: the names are declared here, below all three, and the catalog refuses to
load when its kinds are not exactly these, in this order (it gives each its class, cause, expected
action and injector).
"""

from __future__ import annotations

#: the interruption kinds, in the catalog's order (faults/catalog.py FAULTS)
INTERRUPTION_KINDS: tuple[str, ...] = (
    "gpu_xid79", "gpu_fallen_off_bus", "gpu_xid109", "gpu_xid62", "gpu_xid94", "nvlink_xid74",
    "hbm_dbe", "hbm_remap_failure", "sram_xid95", "gsp_xid119_crash", "gsp_xid119_hang", "sdc_nan",
    "thermal_runaway", "software_bug", "software_app_xid", "software_stage_bug", "software_oom",
    "dependency_storage", "network_port_error", "nic_fatal", "nccl_stuck_rank", "host_down",
)

#: the straggler kinds, in the catalog's order (faults/catalog.py STRAGGLERS)
STRAGGLER_KINDS: tuple[str, ...] = (
    "straggler_slow_gpu", "straggler_thermal_node", "straggler_stage_imbalance",
)

#: the kinds outside the Llama 3 mix, only named in a fault_sequence (faults/catalog.py SILENT)
SILENT_KINDS: tuple[str, ...] = ("sdc_param_flip",)

#: every kind a fault_sequence may name
KIND_NAMES: frozenset[str] = frozenset(INTERRUPTION_KINDS + STRAGGLER_KINDS + SILENT_KINDS)
