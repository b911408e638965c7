"""Checks on the values a dump holds, shared by both parsers: integers that fit 64 bits, strings,
the top level of a dump, the element budget (fr_limits) and short descriptions of bad values for
error messages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from faultlens.collectors.artifacts.flight_recorder.model import DumpFormatError
from faultlens.collectors.artifacts.fr_limits import DumpLimits

SCALAR_TYPES = (str, int, float, bool, bytes, type(None))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DIGIT_TEXT = re.compile(r"-?\d+")


def _show(value: Any) -> str:
    """A short, bounded description of a value for an error message (never the repr of a container
    or of a huge
    integer: those can cost unbounded time)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return str(value) if -(10**20) < value < 10**20 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (str, bytes)):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def as_int(value: Any, what: str) -> int | None:
    """An integer field: None, an int of 64 bits, or a bool, float or digit string that is one; else
    DumpFormatError naming `what`."""
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise DumpFormatError(f"{what}: {_show(value)} does not fit 64 bits")
        return value
    if isinstance(value, str):
        text = value.strip()
        if _DIGIT_TEXT.fullmatch(text):
            if len(text) > 20:
                raise DumpFormatError(f"{what}: an integer of {len(text)} digits does not fit 64 "
                                      "bits")
            return as_int(int(text), what)
    if isinstance(value, float) and value.is_integer():
        return as_int(int(value), what)
    raise DumpFormatError(f"{what}: expected an integer, got {type(value).__name__} {_show(value)}")


def as_text(value: Any, what: str) -> str | None:
    """A string field: None, a string, or a scalar written as one; a container is refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, SCALAR_TYPES):
        return str(value)
    raise DumpFormatError(f"{what}: expected a string, got a {type(value).__name__}")


class ElementBudget:
    """Elements (entries + shapes + dims + dtypes + frames kept) one dump may expand to (fr_limits),
    counted the same way by both readers."""

    def __init__(self, limits: DumpLimits, file_bytes: int) -> None:
        self.left = limits.element_budget(file_bytes)
        self.limit = self.left
        self.entries = limits.entry_budget(file_bytes)
        self.file_bytes = file_bytes

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise DumpFormatError(f"expands to more than {self.limit} elements (entries, shapes, "
                                  f"dims, dtypes, frames) from {self.file_bytes} bytes: shared "
                                  "references? (limit: fr_limits elements_per_byte)")


def _check_version(version: Any) -> None:
    if version is None:
        return
    if not isinstance(version, (str, int, float)) or isinstance(version, bool):
        raise DumpFormatError(f"unsupported flight-recorder format version {_show(version)} "
                              "(expected 2.x)")
    text = str(version) if not isinstance(version, str) else version
    if not re.fullmatch(r"2\.\d{1,6}(\.\d{1,6})?", text):
        raise DumpFormatError(f"unsupported flight-recorder format version {_show(text)} "
                              "(expected 2.x)")


def check_top(obj: Any) -> Mapping[str, Any]:
    """The top level of a dump, checked (a dict with a 2.x version or entries, well-typed dump-wide
    fields) and returned; else DumpFormatError."""
    if not isinstance(obj, Mapping):
        raise DumpFormatError(f"not a flight-recorder dump: top level is a {type(obj).__name__}, "
                              "expected a dict")
    if "version" not in obj and "entries" not in obj:
        keys = ", ".join(
            sorted(_show(k) if not isinstance(k, str) else k[:40] for k in list(obj)[:64])[:6]
        )
        raise DumpFormatError("not a flight-recorder dump: no 'version' or 'entries' key "
                              f"(keys: {keys})")
    _check_version(obj.get("version"))
    entries = obj.get("entries", [])
    if not isinstance(entries, list):
        raise DumpFormatError(f"'entries' is a {type(entries).__name__}, expected a list")
    for key in ("pg_config", "pg_status"):
        if obj.get(key) is not None and not isinstance(obj.get(key), Mapping):
            raise DumpFormatError(f"'{key}' is a {type(obj[key]).__name__}, expected a dict")
    for key in obj.get("pg_status") or ():
        if not isinstance(key, (str, int)):
            raise DumpFormatError(f"'pg_status' key {_show(key)}: expected a process group id")
    for key in ("node", "comm_lib_version", "nccl_version"):
        as_text(obj.get(key), key)
    return obj


def dump_header(top: Mapping[str, Any]) -> dict[str, Any]:
    """The dump-wide fields of a checked top level, as Dump's keyword arguments (the rank aside)."""
    return {
        "version": None if top.get("version") is None else str(top.get("version")),
        "world_size": as_int(top.get("world_size"), "world_size"),
        "node": as_text(top.get("node"), "node"),
        "comm_lib_version": as_text(top.get("comm_lib_version", top.get("nccl_version")),
                                    "comm_lib_version"),
        "pg_config": top.get("pg_config") or {},
        "pg_status": top.get("pg_status") or {},
    }
