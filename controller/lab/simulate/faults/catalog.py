"""The catalog: the interruption kinds at the Llama 3 mix (FAULTS), the straggler kinds
(STRAGGLERS), the kinds only a fault_sequence names (SILENT), every kind by name (BY_KIND), and a
weighted draw. The kinds' names are declared below the settings too (simulate/kind_names.py, what
a fault_sequence may name): the catalog must hold exactly those."""

from __future__ import annotations

import numpy as np

from faultlens.controller.lab.fault_labels import ExpectedAction, LabelClass
from faultlens.controller.lab.simulate.faults import hardware as hw
from faultlens.controller.lab.simulate.faults import network as net
from faultlens.controller.lab.simulate.faults import numerics as sdc
from faultlens.controller.lab.simulate.faults import software as sw
from faultlens.controller.lab.simulate.faults import stragglers as slow
from faultlens.controller.lab.simulate.faults.kinds import FaultKind, Mode
from faultlens.controller.lab.simulate.kind_names import (
    INTERRUPTION_KINDS,
    SILENT_KINDS,
    STRAGGLER_KINDS,
)

_F, _E, _D = ExpectedAction.FAILOVER, ExpectedAction.ESCALATE, ExpectedAction.DRAIN
_C, _H, _HE, _S, _N = (
    LabelClass.CRASH,
    LabelClass.COLLECTIVE_HANG,
    LabelClass.HEALTH,
    LabelClass.STRAGGLER,
    LabelClass.NUMERICS,
)

# (Llama 3 row, count) split over kinds; the weights sum to the 419 unexpected interruptions.
FAULTS: tuple[FaultKind, ...] = (
    FaultKind("gpu_xid79", "Faulty GPU", 54, Mode.CRASH, _C, "gpu_hardware", _F, hw.strike_xid79),
    FaultKind(
        "gpu_fallen_off_bus",
        "Faulty GPU",
        16,
        Mode.CRASH,
        _C,
        "gpu_hardware",
        _F,
        hw.strike_fallen_no_xid,
    ),
    FaultKind("gpu_xid109", "Faulty GPU", 20, Mode.CRASH, _C, "gpu_hardware", _F, hw.strike_xid109),
    FaultKind("gpu_xid62", "Faulty GPU", 14, Mode.CRASH, _C, "gpu_hardware", _F, hw.strike_xid62),
    FaultKind("gpu_xid94", "Faulty GPU", 20, Mode.CRASH, _C, "gpu_hardware", _F, hw.strike_xid94),
    FaultKind("nvlink_xid74", "Faulty GPU", 24, Mode.HANG, _H, "nvlink", _F, hw.strike_nvlink),
    FaultKind("hbm_dbe", "GPU HBM3 Memory", 58, Mode.CRASH, _C, "hbm", _F, hw.strike_hbm_dbe),
    FaultKind(
        "hbm_remap_failure",
        "GPU HBM3 Memory",
        14,
        Mode.HEALTH,
        _HE,
        "hbm",
        _D,
        hw.strike_remap_failure,
    ),
    FaultKind(
        "sram_xid95", "GPU SRAM Memory", 19, Mode.CRASH, _C, "gpu_hardware", _F, hw.strike_sram
    ),
    FaultKind(
        "gsp_xid119_crash",
        "GPU System Processor",
        9,
        Mode.CRASH,
        _C,
        "gpu_hardware",
        _F,
        hw.strike_gsp_crash,
    ),
    FaultKind(
        "gsp_xid119_hang",
        "GPU System Processor",
        8,
        Mode.HANG,
        _H,
        "gpu_hardware",
        _F,
        hw.strike_gsp_hang,
    ),
    FaultKind(
        "sdc_nan",
        "Silent Data Corruption",
        6,
        Mode.CRASH,
        _C,
        "data_corruption",
        _F,
        hw.strike_sdc,
        hw.prepare_sdc,
    ),
    FaultKind(
        "thermal_runaway",
        "GPU Thermal Interface + Sensor",
        6,
        Mode.CRASH,
        _C,
        "thermal",
        _F,
        hw.strike_thermal_runaway,
        hw.prepare_thermal_runaway,
    ),
    FaultKind(
        "software_bug", "Software Bug", 28, Mode.CRASH, _C, "software", _E, sw.strike_software_all
    ),
    FaultKind(
        "software_app_xid",
        "Software Bug",
        8,
        Mode.CRASH,
        _C,
        "software",
        _E,
        sw.strike_software_app_xid,
    ),
    FaultKind(
        "software_stage_bug",
        "Software Bug",
        10,
        Mode.CRASH,
        _C,
        "software",
        _E,
        sw.strike_software_stage,
    ),
    FaultKind("software_oom", "Software Bug", 8, Mode.CRASH, _C, "oom", _E, sw.strike_oom),
    FaultKind(
        "dependency_storage", "Dependency", 2, Mode.CRASH, _C, "software", _E, sw.strike_dependency
    ),
    FaultKind(
        "network_port_error",
        "Network Switch/Cable",
        35,
        Mode.CRASH,
        _C,
        "network",
        _F,
        net.strike_port_error,
    ),
    FaultKind("nic_fatal", "NIC", 7, Mode.CRASH, _C, "network", _F, net.strike_nic_fatal),
    FaultKind(
        "nccl_stuck_rank",
        "NCCL Watchdog Timeouts",
        7,
        Mode.HANG,
        _H,
        "unknown",
        _F,
        net.strike_stuck_rank,
    ),
    FaultKind(
        "host_down",
        "Host (maintenance, SSD, PSU, chassis, board, CPU, memory)",
        46,
        Mode.HANG,
        _H,
        "host",
        _F,
        net.strike_host_down,
    ),
)

STRAGGLERS: tuple[FaultKind, ...] = (
    FaultKind(
        "straggler_slow_gpu",
        "Straggler",
        45,
        Mode.STRAGGLER,
        _S,
        "gpu_hardware",
        _F,
        slow.strike_slow_gpu,
    ),
    FaultKind(
        "straggler_thermal_node",
        "Straggler",
        30,
        Mode.STRAGGLER,
        _S,
        "thermal",
        _F,
        slow.strike_thermal_node,
    ),
    FaultKind(
        "straggler_stage_imbalance",
        "Straggler",
        25,
        Mode.STRAGGLER,
        _S,
        "workload_imbalance",
        _E,
        slow.strike_stage_imbalance,
    ),
)

# outside the Llama 3 mix (its SDCs are sdc_nan above): named in a fault_sequence, with the
# numerics probe on (SimConfig.numerics_every)
SILENT: tuple[FaultKind, ...] = (
    FaultKind(
        "sdc_param_flip",
        "Silent Data Corruption",
        0,
        Mode.NUMERICS,
        _N,
        "data_corruption",
        _F,
        sdc.strike_param_flip,
    ),
)

BY_KIND: dict[str, FaultKind] = {k.kind: k for k in FAULTS + STRAGGLERS + SILENT}

if (tuple(k.kind for k in FAULTS) != INTERRUPTION_KINDS
        or tuple(k.kind for k in STRAGGLERS) != STRAGGLER_KINDS
        or tuple(k.kind for k in SILENT) != SILENT_KINDS):
    raise RuntimeError("the fault catalog's kinds differ from those declared in "
                       "controller/lab/simulate/kind_names.py: a fault_sequence is checked there")


def draw(kinds: tuple[FaultKind, ...], rng: np.random.Generator) -> FaultKind:
    weights = np.array([k.weight for k in kinds], dtype=float)
    return kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
