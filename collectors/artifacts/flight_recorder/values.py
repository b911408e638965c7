"""Checks on the values a dump holds, shared by both parsers: integers that fit 64 bits, strings,
the top level of a dump, the element budget (fr_limits) and short descriptions of bad values for
error messages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from faultlens.collectors.artifacts.flight_recorder.model import Dump, DumpFormatError
from faultlens.collectors.artifacts.fr_limits import DumpLimits

SCALAR_TYPES = (str, int, float, bool, bytes, type(None))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DIGIT_TEXT = re.compile(r"-?\d+")


def show(value: Any) -> str:
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
            raise DumpFormatError(f"{what}: {show(value)} does not fit 64 bits")
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
    raise DumpFormatError(f"{what}: expected an integer, got {type(value).__name__} {show(value)}")


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
        raise DumpFormatError(f"unsupported flight-recorder format version {show(version)} "
                              "(expected 2.x)")
    text = str(version) if not isinstance(version, str) else version
    if not re.fullmatch(r"2\.\d{1,6}(\.\d{1,6})?", text):
        raise DumpFormatError(f"unsupported flight-recorder format version {show(text)} "
                              "(expected 2.x)")


def check_top(obj: Any) -> Mapping[str, Any]:
    """The top level of a dump, checked (a dict with a 2.x version or entries, well-typed dump-wide
    fields) and returned; else DumpFormatError."""
    if not isinstance(obj, Mapping):
        raise DumpFormatError(f"not a flight-recorder dump: top level is a {type(obj).__name__}, "
                              "expected a dict")
    if "version" not in obj and "entries" not in obj:
        keys = ", ".join(
            sorted(show(k) if not isinstance(k, str) else k[:40] for k in list(obj)[:64])[:6]
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
            raise DumpFormatError(f"'pg_status' key {show(key)}: expected a process group id")
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


_ID_FIELDS = ("record_id", "collective_seq_id", "p2p_seq_id", "op_id")
# present on every entry torch writes (a null one cannot be matched across ranks)
_REQUIRED_IDS = ("record_id", "collective_seq_id")


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def check_fields(dump: Dump, limits: DumpLimits) -> None:
    """The field limits both parsers' columns must meet (fr_limits max_id, max_dim): ids
    non-negative and present where torch always writes them, tensor dimensions those of a tensor;
    else DumpFormatError naming the entry and the field."""
    ids = [(name, *dump.ints[name]) for name in _ID_FIELDS if name in dump.ints]
    ids.append(("pg_id", *dump.pg_id))
    for name, values, valid in ids:
        bad = valid & ((values < 0) | (values > limits.max_id))
        if bad.any():
            i = _first(bad)
            raise DumpFormatError(f"entry {i} {name}: {int(values[i])} is not an id (0.."
                                  f"{limits.max_id}; limit fr_limits max_id)")
    for name in _REQUIRED_IDS:
        if name in dump.ints and dump.n and not dump.ints[name][1].all():
            i = _first(~dump.ints[name][1])
            raise DumpFormatError(f"entry {i} {name}: missing or null (torch writes one on every "
                                  "entry)")
    for name, column in dump.sizes.items():
        bad = (column.dims < 0) | (column.dims > limits.max_dim)
        if bad.any():
            at = _first(bad)
            tensor = int(np.searchsorted(np.cumsum(column.ndims), at, side="right"))
            entry = int(np.searchsorted(np.cumsum(np.maximum(column.counts, 0)), tensor,
                                        side="right"))
            raise DumpFormatError(f"entry {entry} {name}: dimension {int(column.dims[at])} is not "
                                  f"a tensor's (0..{limits.max_dim}; limit fr_limits max_dim)")


def _status_last(status: Any) -> int | None:
    if not isinstance(status, Mapping):
        return None
    try:
        value = as_int(status.get("last_enqueued_collective"), "last_enqueued_collective")
    except DumpFormatError:
        return None
    return value if value is not None and value >= 0 else None


def check_sequences(dump: Dump) -> None:
    """A dump whose sequence numbers contradict each other (a flipped bit in a valid pickle made
    its rank, or innocent ones, the culprit): per process group, in record order, collective_seq_id
    never goes back (nor repeats over the collectives, is_p2p false), nor p2p_seq_id over the p2p
    entries, and the group's last entry is not beyond the last op its pg_status says was enqueued.
    Else DumpFormatError naming the entry, the group
    and why; the dump is then a missing one (its rank is named as such, never as a culprit by what
    it contradicts)."""
    n = dump.n
    if n == 0 or "collective_seq_id" not in dump.ints:
        return
    pg, pg_valid = dump.pg_id
    seq, seq_valid = dump.ints["collective_seq_id"]
    p2p, p2p_valid = dump.ints.get("p2p_seq_id", (np.zeros(n, np.int64), np.zeros(n, bool)))
    is_p2p = dump.is_p2p == 1
    key = np.where(pg_valid, pg, -1)
    order = np.lexsort((np.arange(n), key))
    same = key[order][1:] == key[order][:-1]
    s = seq[order]
    back = same & seq_valid[order][1:] & seq_valid[order][:-1] & (s[1:] < s[:-1])
    if back.any():
        at = _first(back)
        raise DumpFormatError(_contradiction(dump, int(order[at + 1]), "collective_seq_id",
                                             int(s[at + 1]), f"after {int(s[at])}"))
    # a collective (is_p2p false) takes the group's next seq: two with one seq is a contradiction
    # too (a p2p entry repeats the last collective's)
    coll = order[(dump.is_p2p[order] == 0) & seq_valid[order] & (key[order] >= 0)]
    c = seq[coll]
    again = (key[coll][1:] == key[coll][:-1]) & (c[1:] == c[:-1])
    if again.any():
        at = _first(again)
        raise DumpFormatError(_contradiction(dump, int(coll[at + 1]), "collective_seq_id",
                                             int(c[at + 1]), "again after entry "
                                             f"{int(coll[at])}"))
    mine = order[is_p2p[order] & p2p_valid[order]]
    q = p2p[mine]
    back = (key[mine][1:] == key[mine][:-1]) & (q[1:] < q[:-1])
    if back.any():
        at = _first(back)
        raise DumpFormatError(_contradiction(dump, int(mine[at + 1]), "p2p_seq_id", int(q[at + 1]),
                                             f"after {int(q[at])}"))
    last_of_group = order[np.append(~same, True)]
    for i in last_of_group.tolist():
        if not pg_valid[i]:
            continue
        last = _status_last(dump.pg_status.get(str(int(pg[i])), dump.pg_status.get(int(pg[i]))))
        field, value, valid = (("p2p_seq_id", p2p[i], p2p_valid[i]) if is_p2p[i]
                               else ("collective_seq_id", seq[i], seq_valid[i]))
        if last is not None and valid and value > last:
            raise DumpFormatError(_contradiction(dump, i, field, int(value),
                                                 f"beyond the group's last enqueued op {last} "
                                                 "(pg_status)"))


def _contradiction(dump: Dump, i: int, field: str, value: int, why: str) -> str:
    names = dump.strings.get("pg_name")
    name = ""
    if names is not None and names.codes[i] >= 0:
        name = f" ({str(names.values[names.codes[i]])[:60]})"
    return (f"entry {i} {field} {value} {why} in process group {int(dump.pg_id[0][i])}{name}: "
            "the dump's sequence numbers contradict each other (corrupt?)")
