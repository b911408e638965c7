"""gpu_events rows as the GPU collectors write them (interface 2 of the helper brief).

Kernel-log Xid lines are printed in the driver's own format (kernel_rc.c), as a syslog line of the
node, and go through the kmsg collector's own parser (faultlens.collectors.sources.kmsg): the Xid
row (number, pid and process name when the driver printed them, message, PCI address in NVML's
bus-id form) plus the condition rows the parser derives from the same line (48 -> ecc_dbe, 63 ->
remap_pending, 64 -> remap_failure, 79 -> gpu_lost, 154 -> recovery_action). NVML's Xid event
carries only the number and the device (no pid, no text), in the NVML source's wording, so the same
fault usually lands twice, once from each source.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from faultlens.collectors.sources.gpu_backend import GpuDevice
from faultlens.collectors.sources.kmsg import KernelLogParser, events_to_rows
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.controller.lab.simulate.cluster import Gpu, Node
from faultlens.errors import FaultlensError


class KmsgParseError(RuntimeError, FaultlensError):
    """A kernel-log line the simulator wrote is not understood by the kmsg collector (a simulator
    bug).
    """


def syslog_line(ts_ns: int, host: str, message: str) -> str:
    """The line as rsyslog writes kernel messages with RFC 3339 high-precision timestamps."""
    moment = dt.datetime.fromtimestamp(ts_ns // 1_000_000_000, tz=dt.UTC).replace(
        microsecond=(ts_ns % 1_000_000_000) // 1000)
    return f"{moment.isoformat()} {host} kernel: {message}"


@dataclass(frozen=True)
class XidLine:
    code: int
    message: str
    pid: int | None = None  # None: the driver printed no process context
    process_name: str | None = None
    unknown_process: bool = False  # pid='<unknown>', name=<unknown> (535-series drivers)

    def render(self, gpu: Gpu) -> str:
        if self.unknown_process:
            context = "pid='<unknown>', name=<unknown>, "
        elif self.pid is not None and self.process_name is not None:
            context = f"pid={self.pid}, name={self.process_name}, "
        elif self.pid is not None:
            context = f"pid={self.pid}, "
        else:
            context = ""
        return f"NVRM: Xid (PCI:{gpu.kmsg_pci}): {self.code}, {context}{self.message}"


class GpuEventFactory:
    def __init__(self, cluster: str, job_id: str) -> None:
        self.cluster = cluster
        self.job_id = job_id

    def _base(self, ts: int, node: Node, gpu: Gpu, attempt: int | None) -> dict[str, Any]:
        return {
            "ts": ts,
            "cluster": self.cluster,
            "node": node.name,
            "job_id": self.job_id,
            "attempt": attempt,
            "gpu_index": gpu.index,
            "gpu_uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
        }

    def kernel_log(
        self, ts: int, node: Node, attempt: int | None, message: str
    ) -> list[dict[str, Any]]:
        """The rows the kmsg source writes for one kernel message of `node` printed at `ts`."""
        line = syslog_line(ts, node.name, message)
        parser = KernelLogParser(tz=dt.UTC)
        events = parser.feed(line)
        if not events:
            raise KmsgParseError(f"the kmsg parser found no GPU event in {line!r}")
        devices = {
            g.pci_bus_id: GpuDevice(index=g.index, uuid=g.uuid, pci_bus_id=g.pci_bus_id)
            for g in node.gpus
        }
        identity = NodeIdentity(
            node=node.name, cluster=self.cluster, job_id=self.job_id, attempt=attempt
        )
        return events_to_rows(events, identity, devices=devices, default_ts_ns=ts)

    def kmsg_xid(
        self, ts: int, node: Node, gpu: Gpu, attempt: int | None, line: XidLine
    ) -> list[dict[str, Any]]:
        return self.kernel_log(ts, node, attempt, line.render(gpu))

    def nvml_xid(
        self, ts: int, node: Node, gpu: Gpu, attempt: int | None, code: int
    ) -> dict[str, Any]:
        return {
            **self._base(ts, node, gpu, attempt),
            "source": "nvml_event",
            "kind": "xid",
            "code": code,
            "message": f"NVML Xid event {code}",
        }

    def kmsg_fallen_off_bus(
        self, ts: int, node: Node, gpu: Gpu, attempt: int | None
    ) -> list[dict[str, Any]]:
        return self.kernel_log(ts, node, attempt, f"NVRM: GPU {gpu.kmsg_pci}.0: GPU has fallen off "
                                                  "the bus.")

    def sample_event(
        self,
        ts: int,
        node: Node,
        gpu: Gpu,
        attempt: int | None,
        kind: str,
        code: int | None,
        message: str,
    ) -> dict[str, Any]:
        return {
            **self._base(ts, node, gpu, attempt),
            "source": "nvml_sample",
            "kind": kind,
            "code": code,
            "message": message,
            "raw": None,
        }


# --- message templates (driver wording; see reference/gpu-signals.md)
# -------------------------------------------

def xid79() -> XidLine:
    return XidLine(79, "GPU has fallen off the bus.")


def xid48(addr: int, partition: int, sub: int) -> XidLine:
    return XidLine(
        48,
        "An uncorrectable double bit error (DBE) has been detected on GPU in the "
        "framebuffer at "
        f"physAddr 0x{addr:x} partition {partition}, subpartition {sub}.",
        unknown_process=True,
    )


def xid63(pid: int, row: int) -> XidLine:
    return XidLine(63, f"Row Remapper: New row (0x{row:016x}) marked for remapping, reset gpu to "
                       "activate.", pid=pid)


def xid64(row: int) -> XidLine:
    return XidLine(64, f"Row Remapper Error: (0x{row:016x}) - All reserved rows for bank are "
                       "remapped",
                   unknown_process=True)


def xid74(pid: int, link: int) -> XidLine:
    return XidLine(74, f"NVLink: fatal error detected on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, "
                       "0x0, 0x0)",
                   pid=pid, process_name="python3")


def xid94(pid: int) -> XidLine:
    return XidLine(94, "Contained: SM (0x1). RST: No, D-RST: No", pid=pid, process_name="python3")


def xid95_sram() -> XidLine:
    return XidLine(95, "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No", unknown_process=True)


def xid109(pid: int) -> XidLine:
    return XidLine(109, "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005", pid=pid,
                   process_name="pt_main_thread")


def xid62() -> XidLine:
    return XidLine(62, "0f5c(1d28) 00000000 00000000", unknown_process=True)


def xid119(pid: int, gpu_index: int) -> XidLine:
    return XidLine(119, f"Timeout after 6s of waiting for RPC response from GPU{gpu_index} GSP! "
                        "Expected function 76 "
                   "(GSP_RM_CONTROL) (0x20800a4c 0x4).", pid=pid, process_name="python3")


def xid120(pc: int) -> XidLine:
    return XidLine(120, f"GSP task timeout @ pc:0x{pc:x}, task: 1", unknown_process=True)


def xid154(old: int, new: int) -> XidLine:
    names = {
        0: "None",
        1: "GPU Reset Required",
        2: "Node Reboot Required",
        3: "Drain P2P",
        4: "Drain and Reset",
    }
    return XidLine(154, f"GPU recovery action changed from 0x{old:x} ({names[old]}) to 0x{new:x} "
                        f"({names[new]})")


def xid13(pid: int, name: str) -> XidLine:
    return XidLine(
        13,
        "Graphics SM Warp Exception on (GPC 4, TPC 1, SM 0): Out Of Range Address",
        pid=pid,
        process_name=name,
    )


def xid31(pid: int, name: str, addr: int) -> XidLine:
    hi, lo = divmod(addr, 1 << 32)
    return XidLine(31, "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 "
                       "faulted @ "
                   f"0x{hi:x}_{lo:08x}. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE", pid=pid,
                   process_name=name)


def xid43(pid: int, name: str) -> XidLine:
    return XidLine(43, "Ch 00000010", pid=pid, process_name=name)
