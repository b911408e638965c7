"""The XID catalog (interface 1 of the helper brief): what each Xid means, NVIDIA's immediate
action, whether it is a hardware fault and what must leave the job, plus NVIDIA's decode of the
NVLink5 Xids 144-150 from a line's intrInfo and errorStatus. Loaded from rules/xid.yaml, validated
against a pydantic model (XidFile); a bad file fails with the file, the key and what was expected.
attribution may import this module (the catalog is a contract, like the schema)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from faultlens import environment
from faultlens.collectors.rule_loader import RuleFileError, field_error, read_document, validate
from faultlens.collectors.rule_model import FileModel, FormatVersion1, Text
from faultlens.resources import rule_file, shipped_rule_file

DEFAULT_XID_PATH = shipped_rule_file("xid.yaml")  # packaged; load_xid_catalog reads rule_file
# a user's copy of rules/xid.yaml replaces the shipped one
XID_CATALOG_ENV = environment.XID_CATALOG.name
FORMAT_VERSION = 1


class XidComponent(StrEnum):
    GPU = "gpu"
    HBM = "hbm"
    SRAM = "sram"
    NVLINK = "nvlink"
    PCIE = "pcie"
    GSP = "gsp"
    DRIVER = "driver"
    APPLICATION = "application"
    UNKNOWN = "unknown"


class XidScope(StrEnum):
    """What must leave the job."""

    NONE = "none"
    GPU = "gpu"
    NODE = "node"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    component: XidComponent
    action: str
    leave: XidScope
    hardware: bool = False
    description: str = ""
    investigatory: str = ""


@dataclass(frozen=True)
class Nvlink5Rule:
    """One row of NVIDIA's "XID 144-150 Decode" sheet."""

    xid: int
    unit: str
    patterns: tuple[tuple[int, int], ...]  # (mask, value) per intrInfo pattern (v1, v2)
    error_status: int
    resolution: str
    investigatory: str
    severity: str
    hw_sw: str
    then: str | None = None

    def matches(self, intr_info: int, error_status: int) -> bool:
        return error_status == self.error_status and any(
            intr_info & mask == value for mask, value in self.patterns
        )


@dataclass(frozen=True)
class Nvlink5Decoded:
    """What NVIDIA's catalog says of one NVLink5 Xid line."""

    rule: Nvlink5Rule
    unit: str  # as the line prints it
    intr_info: int
    error_status: int

    @property
    def leave(self) -> XidScope:
        """RESET_GPU: the GPU leaves; IGNORE and XID_154_EVAL (a following Xid 154 decides,
        else RESTART_APP): nothing leaves on this line."""
        return XidScope.GPU if self.rule.resolution == "RESET_GPU" else XidScope.NONE

    def describe(self) -> str:
        return (
            f"NVIDIA's catalog: {self.rule.unit} {self.rule.severity} -> "
            f"{self.rule.resolution} (investigate: {self.rule.investigatory})"
        )


# `<unit> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<intrInfo> <errorStatus> ...)`; bounded quantifiers
NVLINK5_FIELDS_RE = re.compile(
    r"^(?P<unit>[A-Z0-9_/]{1,64})[ \t]{1,8}(?P<severity>[A-Za-z-]{1,16})\b[^(]{0,80}\("
    r"(?P<intr>0x[0-9A-Fa-f]{1,8})[ \t]{1,8}(?P<status>0x[0-9A-Fa-f]{1,8})"
)


def _pattern(bits: str) -> tuple[int, int]:
    """`------000001-------------0010001` (bit 31 first, '-' any) -> (mask, value)."""
    mask = value = 0
    for bit in bits:
        mask, value = mask << 1, value << 1
        if bit != "-":
            mask |= 1
            value |= bit == "1"
    return mask, value


class XidCatalogError(RuleFileError):
    """rules/xid.yaml cannot be used: the message names the file, the key and what was expected."""


_Bits = Annotated[str, Field(pattern=r"^[-01]{32}$")]
_Bucket = Annotated[str, Field(pattern=r"^[A-Z0-9_/]+$")]


class _Entry(FileModel):
    code: Annotated[int, Field(ge=0, le=65535)]
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Z0-9_]+$")]
    description: Text
    component: Literal[tuple(c.value for c in XidComponent)]  # type: ignore[valid-type]
    action: _Bucket
    investigatory: Text
    leave: Literal[tuple(s.value for s in XidScope)]  # type: ignore[valid-type]
    hardware: bool
    old_causes: list[Literal["all", "H", "D", "A", "S", "B", "T", "F"]] = Field(
        default_factory=list
    )
    app_error: bool = False
    note: str = ""
    peers: str = ""


class _DecodeRow(FileModel):
    xid: Annotated[int, Field(ge=144, le=150)]
    unit: Text
    intrinfo_v1: _Bits
    intrinfo_v2: _Bits
    error_status: Annotated[str, Field(pattern=r"^0x[0-9A-Fa-f]{1,8}$")]
    resolution: _Bucket
    investigatory: Text
    severity: Text
    hw_sw: Text
    then: _Bucket | None = None


class XidFile(FileModel):
    """rules/xid.yaml."""

    format_version: FormatVersion1
    catalog_revision: str | None = None
    xids: Annotated[list[_Entry], Field(min_length=1)]
    nvlink5_decode: list[_DecodeRow] = Field(default_factory=list)


def _unknown(code: int) -> XidInfo:
    return XidInfo(
        code=code,
        name=f"XID_{code}",
        component=XidComponent.UNKNOWN,
        action="UNKNOWN",
        leave=XidScope.UNKNOWN,
    )


class XidCatalog:
    """Lookup by Xid number; an unlisted code gives component UNKNOWN and leave UNKNOWN."""

    def __init__(
        self,
        entries: Mapping[int, XidInfo],
        *,
        app_errors: frozenset[int] = frozenset(),
        revision: str | None = None,
        path: str | None = None,
        nvlink5: tuple[Nvlink5Rule, ...] = (),
    ) -> None:
        self._entries = dict(entries)
        self.app_errors = app_errors
        self.revision = revision
        self.path = path
        self.nvlink5 = nvlink5

    def get(self, code: int) -> XidInfo:
        return self._entries.get(int(code)) or _unknown(int(code))

    def __contains__(self, code: object) -> bool:
        return code in self._entries

    def __iter__(self) -> Iterator[XidInfo]:
        return iter(sorted(self._entries.values(), key=lambda info: info.code))

    def __len__(self) -> int:
        return len(self._entries)

    def is_application_error(self, code: int) -> bool:
        """True where NVIDIA's k8s-device-plugin keeps the GPU healthy for this Xid."""
        return int(code) in self.app_errors

    def decode_nvlink5(self, code: int, message: str) -> Nvlink5Decoded | None:
        """NVIDIA's decode of an NVLink5 Xid (144-150) from the line's message (what follows the
        code): None when the code is not one, the fields are not there or no row matches."""
        if not 144 <= int(code) <= 150:
            return None
        match = NVLINK5_FIELDS_RE.match(message.strip())
        if match is None:
            return None
        unit = match.group("unit")
        intr, status = int(match.group("intr"), 16), int(match.group("status"), 16)
        rows = [r for r in self.nvlink5 if r.xid == int(code) and r.matches(intr, status)]
        if not rows:
            return None
        named = [r for r in rows if unit == r.unit or unit in r.unit.split("/")]
        return Nvlink5Decoded(
            rule=(named or rows)[0], unit=unit, intr_info=intr, error_status=status
        )


def parse_xid_catalog(document: Any, source: str = "<memory>") -> XidCatalog:
    """Validate a loaded YAML document and build the catalog."""
    validate(document, XidFile, source, error=XidCatalogError)
    entries: dict[int, XidInfo] = {}
    positions: dict[int, int] = {}
    app_errors = set()
    for position, raw in enumerate(document["xids"]):
        code = raw["code"]
        if code in entries:
            raise field_error(
                source,
                ["xids", position, "code"],
                f"expected a unique Xid, {code} is already at xids[{positions[code]}]",
                XidCatalogError,
            )
        positions[code] = position
        entries[code] = XidInfo(
            code=code,
            name=raw["name"],
            component=XidComponent(raw["component"]),
            action=raw["action"],
            leave=XidScope(raw["leave"]),
            hardware=raw["hardware"],
            description=raw["description"],
            investigatory=raw["investigatory"],
        )
        if raw.get("app_error"):
            app_errors.add(code)
    nvlink5 = tuple(
        Nvlink5Rule(
            xid=row["xid"],
            unit=row["unit"],
            patterns=(_pattern(row["intrinfo_v1"]), _pattern(row["intrinfo_v2"])),
            error_status=int(row["error_status"], 16),
            resolution=row["resolution"],
            investigatory=row["investigatory"],
            severity=row["severity"],
            hw_sw=row["hw_sw"],
            then=row.get("then"),
        )
        for row in document.get("nvlink5_decode", [])
    )
    return XidCatalog(
        entries,
        app_errors=frozenset(app_errors),
        revision=document.get("catalog_revision"),
        path=source,
        nvlink5=nvlink5,
    )


def load_xid_catalog(path: str | Path | None = None) -> XidCatalog:
    """Load and validate the catalog: `path`, else $FAULTLENS_XID_CATALOG, else xid.yaml of the
    rules directory ($FAULTLENS_RULES, else the packaged rules/). Raises XidCatalogError."""
    if path is None:
        path = environment.XID_CATALOG.get()
    file = Path(path) if path is not None else rule_file("xid.yaml")
    return parse_xid_catalog(read_document(file, error=XidCatalogError), str(file))


@functools.lru_cache(maxsize=1)
def shipped_xid_catalog() -> XidCatalog:
    """The catalog as load_xid_catalog() finds it, read once per process (the kernel-log parser's
    default for decoding NVLink5 lines)."""
    return load_xid_catalog()
