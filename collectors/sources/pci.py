"""PCI bus ids in NVML's form, so kernel-log, dcgm-exporter and NVML rows of one GPU join.

The kernel log prints `domain:bus:device` (`PCI:0000:2b:00`, very old drivers without `PCI:`),
NVSwitch lines and `GPU has fallen off the bus` lines print `domain:bus:device.function`, NVML's
`busId` and dcgm-exporter's `pci_bus_id` label are `00000000:2B:00.0` (8 hex digit domain,
upper-case). Everything is converted to the last.
"""

from __future__ import annotations

import functools
import re

_PCI_RE = re.compile(
    r"^\s*(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?\s*$"
)


def normalize_pci_bus_id(text: str | bytes | None) -> str | None:
    """`0000:2b:00`, `PCI:0000:2b:00`, `0000:2b:00.0`, `00000000:2B:00.0` -> `00000000:2B:00.0`;
    None when `text` is not a PCI address."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    return _normalize(text)


@functools.lru_cache(maxsize=4096)
def _normalize(text: str) -> str | None:
    match = _PCI_RE.match(text)
    if match is None:
        return None
    domain = int(match.group("domain") or "0", 16)
    bus = int(match.group("bus"), 16)
    device = int(match.group("dev"), 16)
    function = int(match.group("fn") or "0")
    if device > 0x1F:
        return None
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function}"
