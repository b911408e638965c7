"""Kernel-log GPU events: the parser (NVIDIA driver Xid lines, NVSwitch SXid lines, "GPU has fallen
off the bus", row-remapper messages) and the source that reads /dev/kmsg, a log file, or `journalctl
-k -o json` output.

Line shapes accepted (each may carry any of the prefixes below):
    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit
    error ... NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping,
    reset gpu to activate. NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001
    caused by previous Xid 149 NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=..., name=...,
    ...      (MIG) NVRM: Xid (0000:01:00): 31, Ch 00000001, ...
    (very old drivers, no "PCI:") NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from
    0x4 (Drain and Reset) to 0x1 (...) nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal,
    Link 46 egress non-posted PRIV error (First) NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.
    (no Xid line) NVRM: The NVIDIA GPU 0000:18:00.0 / ... has fallen off the bus and is not
    responding to commands. (multi-line) NVRM: GPU at PCI:0000:2b:00: GPU-6a6d...
    (remembered: PCI -> UUID)
Prefixes: /dev/kmsg records (`6,1234,5678901234,-;msg`), `journalctl -k -o json` objects, syslog
(`Nov 30 12:00:00 host kernel: [ 12.345] msg`), ISO timestamps (`2026-11-30T12:00:00.123+00:00 host
kernel: msg`), `dmesg -T` (`[Mon Nov 30 12:00:00 2026] msg`) and plain dmesg (`[  12.345678] msg`,
relative to boot).

An Xid line is one `xid` event; the Xids that state a GPU condition also give the kind the engine
keys on (the same raw line): 48 -> ecc_dbe, 63 with "Row Remapper" -> remap_pending (without:
retired_page_pending), 64 with "Row Remapper" -> remap_failure, 79 -> gpu_lost, 154 ->
recovery_action (code = the new action). A line that looks like a GPU line but cannot be parsed is
counted as bad and skipped; other lines are ignored. Nothing raises.

The modules, in reading order: events (KernelGpuEvent, the parse counts, the bad-line error, the
store's limits on an event), envelope (the transport prefixes: message, time, host), parser
(KernelLogParser: messages into events), rows (events into gpu_events rows), source (KmsgSource, the
node agent's Source) and read (read_kernel_log, the one-shot import of a file).
"""

from __future__ import annotations

from faultlens.collectors.sources.kmsg.envelope import (
    DMESG_REL_RE,
    DMESG_T_RE,
    ISO_RE,
    KERNEL_TAG_RE,
    KMSG_RE,
    SYSLOG_RE,
)
from faultlens.collectors.sources.kmsg.events import KernelGpuEvent, ParseStats
from faultlens.collectors.sources.kmsg.parser import (
    ANY_PCI_RE,
    CAUSED_BY_RE,
    FALLEN_RE,
    PID_RE,
    RECOVERY_RE,
    SXID_RE,
    THE_GPU_RE,
    UUID_RE,
    XID_RE,
    KernelLogParser,
)
from faultlens.collectors.sources.kmsg.read import (
    KernelLogFileError,
    KernelLogImport,
    read_kernel_log,
)
from faultlens.collectors.sources.kmsg.rows import device_directory, events_to_rows
from faultlens.collectors.sources.kmsg.source import KmsgSource, boot_time_ns

__all__ = [
    "ANY_PCI_RE",
    "CAUSED_BY_RE",
    "DMESG_REL_RE",
    "DMESG_T_RE",
    "FALLEN_RE",
    "ISO_RE",
    "KERNEL_TAG_RE",
    "KMSG_RE",
    "PID_RE",
    "RECOVERY_RE",
    "SXID_RE",
    "SYSLOG_RE",
    "THE_GPU_RE",
    "UUID_RE",
    "XID_RE",
    "KernelGpuEvent",
    "KernelLogFileError",
    "KernelLogImport",
    "KernelLogParser",
    "KmsgSource",
    "ParseStats",
    "boot_time_ns",
    "device_directory",
    "events_to_rows",
    "read_kernel_log",
]
