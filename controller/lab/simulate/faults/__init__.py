"""The fault catalog and its injectors.

The mix follows the Llama 3 405B interruption table (reference/failures.md, 419 unexpected
interruptions): each row's count is split over the concrete ways that component fails. Stragglers
(not interruptions) are drawn from their own rate. Every injector leaves the telemetry the real
fault leaves, in the collectors' row conventions, and a label (kept outside the store) with what a
correct system would conclude.

Modules: kinds (Mode, Target, Outcome, FaultKind), pieces (target, label, Xid lines, restart delay),
endings (how an attempt ends: crash, hang), the injectors by family (hardware: GPU and health;
network: links and hosts; software; stragglers), catalog (FAULTS, STRAGGLERS, BY_KIND, draw).
"""

from faultlens.controller.lab.simulate.faults.catalog import BY_KIND, FAULTS, STRAGGLERS, draw
from faultlens.controller.lab.simulate.faults.endings import (
    Exit,
    communicating_peers,
    crash,
    hang,
    log_stderr,
    report_exits,
)
from faultlens.controller.lab.simulate.faults.hardware import (
    NAN_CHECK_FRAME,
    prepare_sdc,
    prepare_thermal_runaway,
    strike_fallen_no_xid,
    strike_gsp_crash,
    strike_gsp_hang,
    strike_hbm_dbe,
    strike_nvlink,
    strike_remap_failure,
    strike_sdc,
    strike_sram,
    strike_thermal_runaway,
    strike_xid62,
    strike_xid79,
    strike_xid94,
    strike_xid109,
)
from faultlens.controller.lab.simulate.faults.kinds import (
    FaultKind,
    Mode,
    Outcome,
    Prepare,
    Strike,
    Target,
)
from faultlens.controller.lab.simulate.faults.network import (
    strike_host_down,
    strike_nic_fatal,
    strike_port_error,
    strike_stuck_rank,
)
from faultlens.controller.lab.simulate.faults.pieces import (
    add_xid,
    hw_restart_delay,
    make_label,
    pick_target,
    recovery_action,
)
from faultlens.controller.lab.simulate.faults.software import (
    DEPENDENCY_BUGS,
    SOFTWARE_BUGS,
    STAGE_BUG,
    strike_dependency,
    strike_oom,
    strike_software_all,
    strike_software_app_xid,
    strike_software_stage,
)
from faultlens.controller.lab.simulate.faults.stragglers import (
    strike_slow_gpu,
    strike_stage_imbalance,
    strike_thermal_node,
)

__all__ = [
    "BY_KIND",
    "DEPENDENCY_BUGS",
    "FAULTS",
    "NAN_CHECK_FRAME",
    "SOFTWARE_BUGS",
    "STAGE_BUG",
    "STRAGGLERS",
    "Exit",
    "FaultKind",
    "Mode",
    "Outcome",
    "Prepare",
    "Strike",
    "Target",
    "add_xid",
    "communicating_peers",
    "crash",
    "draw",
    "hang",
    "hw_restart_delay",
    "log_stderr",
    "make_label",
    "pick_target",
    "prepare_sdc",
    "prepare_thermal_runaway",
    "recovery_action",
    "report_exits",
    "strike_dependency",
    "strike_fallen_no_xid",
    "strike_gsp_crash",
    "strike_gsp_hang",
    "strike_hbm_dbe",
    "strike_host_down",
    "strike_nic_fatal",
    "strike_nvlink",
    "strike_oom",
    "strike_port_error",
    "strike_remap_failure",
    "strike_sdc",
    "strike_slow_gpu",
    "strike_software_all",
    "strike_software_app_xid",
    "strike_software_stage",
    "strike_sram",
    "strike_stage_imbalance",
    "strike_stuck_rank",
    "strike_thermal_node",
    "strike_thermal_runaway",
    "strike_xid62",
    "strike_xid79",
    "strike_xid94",
    "strike_xid109",
]
