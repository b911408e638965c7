"""KernelLogParser: kernel-log lines into GPU events (Xid, SXid, fallen off the bus, the kinds some
Xids imply), remembering PCI -> UUID lines and multi-line messages; bad lines are counted, never
raised."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from faultlens.collectors.sources.kmsg.envelope import Envelope, read_envelope
from faultlens.collectors.sources.kmsg.events import (
    MAX_PID,
    BadLine,
    KernelGpuEvent,
    ParseStats,
    check_event,
)
from faultlens.collectors.sources.pci import normalize_pci_bus_id
from faultlens.collectors.sources.xid_catalog import (
    XidCatalog,
    XidCatalogError,
    shipped_xid_catalog,
)

_PCI = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>"
    + _PCI
    + r")(?:\s+GPU-I:(?P<gi>\d{1,4}))?(?:\s+GPU-CI:(?P<ci>\d{1,4}))?\):\s*"
    r"(?P<code>\d{1,6})\s*(?:,\s*(?P<rest>.*))?$"
)
# any other `NVRM: Xid (<where>): <code>...` (a PCI id that is not one, a mangled tail): the event
# is kept without a PCI id, its raw line beside it
XID_LOOSE_RE = re.compile(
    r"NVRM: Xid \((?P<where>[^()]{0,80})\):?[ \t]{0,8}(?P<code>\d{1,6})\b(?P<rest>.*)$"
)
SXID_RE = re.compile(
    r"(?P<dev>nvidia-nvswitch\d+): SXid \((?:PCI:)?(?P<pci>" + _PCI + r")\):\s*(?P<code>\d{1,6})\s*"
    r"(?:,\s*(?P<rest>.*))?$"
)
# Every pattern below runs in time linear in the line's length: no two adjacent quantifiers can
# share characters unboundedly (the old `name=[^,]*?\s*` and `\d+\s*\.?\s*$` forms backtracked
# quadratically: 169 s for a 64 KB line), and the parts that repeat inside a message (`recovery
# action changed ...`) have bounded quantifiers.
PID_RE = re.compile(r"^pid=(?P<pid>'<unknown>'|<unknown>|'?\d{1,24}'?)[ \t]*(?:,[ \t]*|$)")
CAUSED_BY_RE = re.compile(r"caused by previous Xid (?P<code>\d{1,10})\Z")
RECOVERY_RE = re.compile(
    r"recovery action changed from (?P<from>0x[0-9A-Fa-f]{1,16}|\d{1,10})"
    r"(?:[ \t]{0,8}\((?P<from_name>[^)]{0,120})\))?"
    r"[ \t]{1,8}to[ \t]{1,8}(?P<to>0x[0-9A-Fa-f]{1,16}|\d{1,10})"
    r"(?:[ \t]{0,8}\((?P<to_name>[^)]{0,120})\))?"
)
UUID_RE = re.compile(r"NVRM: GPU at PCI:(?P<pci>" + _PCI + r"):\s*(?P<uuid>GPU-[0-9A-Fa-f-]+)")
# drivers on some systems print the lost GPU without its PCI domain (`GPU 18:00.0:`): domain 0
_PCI_ANY_DOMAIN = r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
FALLEN_RE = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>" + _PCI_ANY_DOMAIN + r"):?\s*GPU has fallen off the bus"
)
THE_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (?:at )?(?:PCI:)?(?P<pci>" + _PCI_ANY_DOMAIN + r")")
ANY_PCI_RE = re.compile(
    r"(?<![0-9A-Fa-f:])(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
)
# lines after "The NVIDIA GPU <pci>" in which "fallen off the bus" belongs to it
_MULTILINE_WINDOW = 4
_GPU_RESET = 1  # NVML's recovery action GPU_RESET (an Xid 154's "GPU Reset Required")
_MAX_LINE = 64 * 1024


def _split_name(rest: str) -> tuple[str | None, str]:
    """`name=<process>, <message>` -> (process name or None, message): the name runs to the first
    comma.
    """
    body = rest[len("name=") :]
    comma = body.find(",")
    name, after = (body, "") if comma < 0 else (body[:comma], body[comma + 1 :])
    name = name.strip()
    return (None if not name or name == "<unknown>" else name), after.lstrip()


def _caused_by(message: str) -> int | None:
    """The Xid of a trailing `caused by previous Xid <n>` (optionally followed by one '.')."""
    tail = message.rstrip()
    if tail.endswith("."):
        tail = tail[:-1].rstrip()
    match = CAUSED_BY_RE.search(tail[-48:])
    return int(match.group("code")) if match else None


def _interesting(text: str) -> bool:
    return "NVRM" in text or "SXid" in text or "fallen off the bus" in text


class KernelLogParser:
    """Stateful line parser (it remembers PCI -> UUID lines and multi-line "fallen off the bus"
    messages).

    `boot_time_ns`: wall-clock time of boot, for /dev/kmsg records and plain dmesg lines (None:
    those lines get no time and the source stamps them when read). `tz`: the zone of syslog / dmesg
    -T times (default: local). `now`: the clock used to pick the year of syslog lines (which carry
    none). `catalog`: the Xid catalog that decodes NVLink5 Xids 144-150 (default: rules/xid.yaml,
    read at the first such line).
    """

    def __init__(
        self,
        *,
        boot_time_ns: int | None = None,
        tz: dt.tzinfo | None = None,
        now: Callable[[], float] = time.time,
        catalog: XidCatalog | None = None,
    ) -> None:
        self.boot_time_ns = boot_time_ns
        self.tz = tz
        self._now = now
        self._catalog = catalog
        self.stats = ParseStats()
        self.uuids: dict[str, str] = {}
        self._pending_pci: str | None = None
        self._pending_left = 0
        self._lost_reported: dict[str, int] = {}
        self._line_no: int | None = None

    # -- messages
    # ------------------------------------------------------------
    def _xid(self, match: re.Match[str], env: Envelope, raw: str) -> list[KernelGpuEvent]:
        # a PCI id that is not one (`0001:ab:cd`: device 0xcd > 0x1f) keeps the event, without it
        pci = normalize_pci_bus_id(match.group("pci"))
        code = int(match.group("code"))
        rest = (match.group("rest") or "").strip()
        pid: int | None = None
        name: str | None = None
        pid_match = PID_RE.match(rest)
        if pid_match:
            value = pid_match.group("pid").strip("'")
            pid = int(value) if value.isdigit() else None
            if pid is not None and pid > MAX_PID:
                raise BadLine(f"Xid line with a pid out of range: {value[:24]}")
            rest = rest[pid_match.end() :]
            if rest.startswith("name="):
                name, rest = _split_name(rest)
        elif rest.startswith("pid="):
            raise BadLine("Xid line with an unreadable pid")
        message = rest.strip()
        caused = _caused_by(message)
        event = KernelGpuEvent(
            kind="xid",
            code=code,
            pci_bus_id=pci,
            message=message,
            raw=raw,
            pid=pid,
            process_name=name,
            ts_ns=env.ts_ns,
            host=env.host,
            gpu_uuid=self.uuids.get(pci),
            line_no=self._line_no,
            gpu_instance_id=int(match.group("gi")) if match.group("gi") else None,
            compute_instance_id=int(match.group("ci")) if match.group("ci") else None,
            caused_by_xid=caused,
        )
        return [event, *self._derived(event)]

    def _loose_xid(self, match: re.Match[str], env: Envelope, raw: str) -> list[KernelGpuEvent]:
        """An Xid line off the driver's format: the node still had the error, so the event stays,
        with the PCI id when `where` is one and the rest of the line as its message."""
        where = match.group("where")
        pci = normalize_pci_bus_id(where.split()[0]) if where.split() else None
        message = match.group("rest").strip().lstrip(",").strip()
        event = KernelGpuEvent(
            kind="xid",
            code=int(match.group("code")),
            pci_bus_id=pci,
            message=message,
            raw=raw,
            ts_ns=env.ts_ns,
            host=env.host,
            gpu_uuid=self.uuids.get(pci) if pci else None,
            line_no=self._line_no,
        )
        return [event, *self._derived(event)]

    def _nvlink5(self, event: KernelGpuEvent) -> list[KernelGpuEvent]:
        """NVLink5 Xids 144-150 decoded by NVIDIA's catalog: a sub-code whose resolution is
        RESET_GPU becomes a recovery_action row with NVML's GPU_RESET (1), as a following Xid 154
        would; IGNORE and XID_154_EVAL sub-codes add nothing (a following Xid 154 speaks for
        itself). A catalog that cannot be read decodes nothing: the Xid row itself stays."""
        if self._catalog is None:
            try:
                self._catalog = shipped_xid_catalog()
            except XidCatalogError as exc:
                self._catalog = XidCatalog({}, path=str(exc))
        decoded = self._catalog.decode_nvlink5(event.code or 0, event.message)
        if decoded is None or decoded.rule.resolution != "RESET_GPU":
            return []
        return [
            replace(
                event,
                kind="recovery_action",
                code=_GPU_RESET,
                message=f"Xid {event.code}: {event.message} ({decoded.describe()})",
            )
        ]

    def _derived(self, event: KernelGpuEvent) -> list[KernelGpuEvent]:
        code, text = event.code, event.message
        kind: str | None = None
        derived_code: int | None = None
        if code == 48:
            kind = "ecc_dbe"
        elif code == 63:
            kind = "remap_pending" if "Row Remapper" in text else "retired_page_pending"
        elif code == 64 and "Row Remapper" in text:
            kind = "remap_failure"
        elif code == 79:
            if self._lost_just_reported(event.pci_bus_id):
                return []  # the same loss as a "fallen off the bus" block just before it
            kind = "gpu_lost"
            if event.pci_bus_id is not None:
                self._lost_reported[event.pci_bus_id] = self.stats.lines
        elif code is not None and 144 <= code <= 150:
            return self._nvlink5(event)
        elif code == 154:
            recovery = RECOVERY_RE.search(text)
            if recovery is None:
                return []
            kind = "recovery_action"
            target = recovery.group("to")
            # "01" is 1, not an error
            derived_code = int(target, 16) if target[:2] in ("0x", "0X") else int(target)
            if derived_code > MAX_PID:  # an int32 column; the driver's actions are 0..4
                raise BadLine(f"recovery action out of range: {recovery.group('to')}")
        if kind is None:
            return []
        return [replace(event, kind=kind, code=derived_code, message=f"Xid {code}: {text}")]

    def _sxid(self, match: re.Match[str], env: Envelope, raw: str) -> list[KernelGpuEvent]:
        pci = normalize_pci_bus_id(match.group("pci"))
        if pci is None:
            raise BadLine(f"SXid line with a PCI address that is not one: {match.group('pci')!r}")
        rest = (match.group("rest") or "").strip()
        if rest.startswith(("Severity ", "Data {", "Data{")):
            return []  # continuation lines of the SXid just reported
        return [
            KernelGpuEvent(
                kind="sxid",
                code=int(match.group("code")),
                pci_bus_id=pci,
                message=rest,
                raw=raw,
                ts_ns=env.ts_ns,
                host=env.host,
                device=match.group("dev"),
                line_no=self._line_no,
            )
        ]

    def _lost_just_reported(self, pci: str | None) -> bool:
        """A gpu_lost row for this GPU came from one of the last few lines (either order of the
        driver's Xid 79 and its "fallen off the bus" block is one loss)."""
        last = self._lost_reported.get(pci) if pci is not None else None
        return last is not None and self.stats.lines - last <= _MULTILINE_WINDOW

    def _fallen(
        self, pci: str | None, env: Envelope, raw: str, message: str
    ) -> list[KernelGpuEvent]:
        if pci is not None:
            if self._lost_just_reported(pci):
                return []  # same incident as a line just reported (Xid 79 or the multi-line form)
            self._lost_reported[pci] = self.stats.lines
        text = message.split("NVRM:", 1)[-1].strip()
        return [
            KernelGpuEvent(
                kind="gpu_lost",
                code=None,
                pci_bus_id=pci,
                message=text,
                raw=raw,
                ts_ns=env.ts_ns,
                host=env.host,
                gpu_uuid=self.uuids.get(pci) if pci else None,
                line_no=self._line_no,
            )
        ]

    def _message(self, env: Envelope, raw: str) -> list[KernelGpuEvent] | None:
        """Events of one message; None when the message is not a GPU line."""
        text = env.message
        if "Xid" in text:
            match = SXID_RE.search(text)
            if match:
                return self._sxid(match, env, raw)
            match = XID_RE.search(text)
            if match:
                return self._xid(match, env, raw)
            match = XID_LOOSE_RE.search(text)
            if match:
                return self._loose_xid(match, env, raw)
            if "NVRM: Xid" in text or "SXid (" in text:
                raise BadLine("Xid line that does not match the driver's format")
        match = UUID_RE.search(text)
        if match:
            pci = normalize_pci_bus_id(match.group("pci"))
            if pci is not None:
                self.uuids[pci] = match.group("uuid")
            return []
        match = THE_GPU_RE.search(text)
        if match:
            self._pending_pci = normalize_pci_bus_id(match.group("pci"))
            self._pending_left = _MULTILINE_WINDOW
        if "fallen off the bus" in text:
            match = FALLEN_RE.search(text)
            pci = normalize_pci_bus_id(match.group("pci")) if match else None
            if pci is None:
                any_pci = ANY_PCI_RE.search(text)
                pci = normalize_pci_bus_id(any_pci.group("pci")) if any_pci else None
            if pci is None and self._pending_left > 0:
                pci = self._pending_pci
            if pci is None and "NVRM" not in text:
                return None
            return self._fallen(pci, env, raw, text)
        if self._pending_left > 0:
            self._pending_left -= 1
        return None

    # -- public
    # ------------------------------------------------------------
    def feed(self, line: str | bytes, line_no: int | None = None) -> list[KernelGpuEvent]:
        """Parse one line; returns its events ([] for most lines). Never raises."""
        self.stats.lines += 1
        self._line_no = line_no
        try:
            if isinstance(line, bytes):
                line = line.decode("utf-8", "replace")
            line = line.rstrip("\r\n")
            if len(line) > _MAX_LINE:
                raise BadLine(f"line longer than {_MAX_LINE} characters")
            if not _interesting(line) and not line.startswith("{"):
                self.stats.ignored += 1
                return []
            if (
                line.startswith("{")
                and not _interesting(line)
                and '"MESSAGE":[' not in line.replace(" ", "")
            ):
                self.stats.ignored += 1
                return []
            env = read_envelope(line, boot_time_ns=self.boot_time_ns, tz=self.tz, now=self._now)
            if env is None:
                self.stats.ignored += 1
                return []
            events = self._message(env, line)
            for event in events or ():
                check_event(event)
        except BadLine as exc:
            self._bad(line_no, str(exc))
            return []
        except Exception as exc:  # a parser bug must not stop the collector
            self._bad(line_no, f"{type(exc).__name__}: {exc}")
            return []
        if events is None:
            self.stats.ignored += 1
            return []
        self.stats.events += len(events)
        return events

    def reject(self, event: KernelGpuEvent, reason: str) -> None:
        """Count an event the store refused as a bad line (its line number and why)."""
        self.stats.events -= 1
        self._bad(event.line_no, reason)

    def _bad(self, line_no: int | None, reason: str) -> None:
        self.stats.bad_lines += 1
        if len(self.stats.bad_examples) < 10:
            self.stats.bad_examples.append(
                (line_no if line_no is not None else self.stats.lines, reason)
            )

    def feed_lines(self, lines: Iterable[str | bytes]) -> list[KernelGpuEvent]:
        events: list[KernelGpuEvent] = []
        for number, line in enumerate(lines, start=1):
            events.extend(self.feed(line, number))
        return events
