"""The XID catalog (interface 1 of the helper brief): what each Xid means, NVIDIA's immediate
action, and what must leave the job. Loaded from rules/xid.yaml, validated against a pydantic model
(XidFile); a bad file fails with the file, the key and what was expected. attribution may import
this module (the catalog is a contract, like the schema)."""

from __future__ import annotations

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


class XidCatalogError(RuleFileError):
    """rules/xid.yaml cannot be used: the message names the file, the key and what was expected."""


class _Entry(FileModel):
    code: Annotated[int, Field(ge=0, le=65535)]
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Z0-9_]+$")]
    component: Literal[tuple(c.value for c in XidComponent)]  # type: ignore[valid-type]
    action: Text
    investigatory: Text | None = None
    leave: Literal[tuple(s.value for s in XidScope)]  # type: ignore[valid-type]
    old_causes: list[Literal["all", "H", "D", "A", "S", "B", "T", "F"]] = Field(
        default_factory=list
    )
    app_error: bool = False
    note: str = ""


class XidFile(FileModel):
    """rules/xid.yaml."""

    format_version: FormatVersion1
    catalog_revision: str | None = None
    xids: Annotated[list[_Entry], Field(min_length=1)]


def _unknown(code: int) -> XidInfo:
    return XidInfo(code=code, name=f"XID_{code}", component=XidComponent.UNKNOWN, action="UNKNOWN",
                   leave=XidScope.UNKNOWN)


class XidCatalog:
    """Lookup by Xid number; an unlisted code gives component UNKNOWN and leave UNKNOWN."""

    def __init__(self, entries: Mapping[int, XidInfo], *, app_errors: frozenset[int] = frozenset(),
                 revision: str | None = None, path: str | None = None) -> None:
        self._entries = dict(entries)
        self.app_errors = app_errors
        self.revision = revision
        self.path = path

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
        )
        if raw.get("app_error"):
            app_errors.add(code)
    return XidCatalog(
        entries,
        app_errors=frozenset(app_errors),
        revision=document.get("catalog_revision"),
        path=source,
    )


def load_xid_catalog(path: str | Path | None = None) -> XidCatalog:
    """Load and validate the catalog: `path`, else $FAULTLENS_XID_CATALOG, else xid.yaml of the
    rules directory ($FAULTLENS_RULES, else the packaged rules/). Raises XidCatalogError."""
    if path is None:
        path = environment.XID_CATALOG.get()
    file = Path(path) if path is not None else rule_file("xid.yaml")
    return parse_xid_catalog(read_document(file, error=XidCatalogError), str(file))
