"""What the restricted unpickler admits: the builtin types a loaded value may hold, the errors, the
few globals protocols 0-2 need to spell builtin values (each a checking callable: sets, frozensets,
bytes) and RestrictedUnpickler, whose find_class resolves nothing else."""

from __future__ import annotations

import pickle
import sys
from typing import Any

from faultlens.errors import FaultlensError

ADMITTED_TYPES: tuple[type, ...] = (
    dict,
    list,
    tuple,
    set,
    frozenset,
    str,
    bytes,
    bytearray,
    int,
    float,
    bool,
    type(None),
)


class PickleLoadError(ValueError, FaultlensError):
    """A pickle could not be loaded: truncated, corrupt or refused. The message names the source."""


class UnsafePickleError(PickleLoadError):
    """The pickle asked for something other than builtin containers and scalars (a global, a call,
    an object).
    """


# items a set's construction may visit hashing tuples (shared tuples count each time)
_SET_HASH_BUDGET = 1 << 16


def _check_items(items: Any, what: str) -> None:
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise UnsafePickleError(f"{what}() argument must be a list or tuple, got "
                                f"{type(items).__name__}")
    # (a set argument is never deep)
    if _tuple_weight(list(items), _SET_HASH_BUDGET) > _SET_HASH_BUDGET:
        raise PickleLoadError(f"{what}() of tuples that would cost more than {_SET_HASH_BUDGET} "
                              "steps to hash")


def _make_set(items: Any = ()) -> set:
    _check_items(items, "set")
    return set(items)


def _make_frozenset(items: Any = ()) -> frozenset:
    _check_items(items, "frozenset")
    return frozenset(items)


def _make_bytes(*args: Any) -> bytes:
    if not args:
        return b""
    if (
        len(args) == 1
        and isinstance(args[0], (bytes, list))
        and all(isinstance(b, int) for b in args[0])
    ):
        return bytes(args[0])
    raise UnsafePickleError("bytes() is admitted only empty or from a byte list")


def _latin1_encode(text: Any, encoding: Any = "utf-8", *rest: Any) -> bytes:
    if (
        rest
        or not isinstance(text, str)
        or str(encoding).lower().replace("_", "-") not in ("latin1", "latin-1")
    ):
        raise UnsafePickleError("_codecs.encode is admitted only as encode(str, 'latin1') "
                                "(protocol 2 bytes)")
    return text.encode("latin-1")


class _Helper:
    """One admitted global, as a callable whose attributes cannot be set (BUILD on it fails; a fresh
    one per lookup, so nothing a pickle does to it outlives the load)."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Any) -> None:
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __setattr__(self, name: str, value: Any) -> None:
        raise UnsafePickleError("refused: the pickle tried to set an attribute on an admitted "
                                "global")

    def __reduce__(self) -> Any:
        raise TypeError("not picklable")


ADMITTED_GLOBALS: dict[tuple[str, str], Any] = {}
for _module in ("builtins", "__builtin__"):
    ADMITTED_GLOBALS[(_module, "set")] = _make_set
    ADMITTED_GLOBALS[(_module, "frozenset")] = _make_frozenset
    ADMITTED_GLOBALS[(_module, "bytes")] = _make_bytes
ADMITTED_GLOBALS[("_codecs", "encode")] = _latin1_encode


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves no global beyond the builtin-value helpers above (a fresh
    helper each time, kept in ``issued`` so the caller can check that none escaped into the value).
    """

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.issued: list[_Helper] = []

    def find_class(self, module: str, name: str) -> Any:
        try:
            fn = ADMITTED_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafePickleError(f"refused global {str(module)[:80]}.{str(name)[:80]}: only "
                                    "builtin containers "
                                    "and scalars are admitted") from None
        helper = _Helper(fn)
        self.issued.append(helper)
        return helper

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused persistent id: only builtin containers and scalars are "
                                "admitted")


def any_escaped(issued: list[_Helper]) -> bool:
    """Whether a helper is referenced from anywhere but `issued` (after the unpickler and its memo
    are gone): the pickle returned a callable instead of calling it."""
    # references: the list, the loop variable, getrefcount's argument
    return any(sys.getrefcount(helper) > 3 for helper in issued)


def _tuple_weight(value: Any, limit: int) -> int:
    """Items a hash of `value` visits, counting shared tuples each time, up to limit + 1."""
    total = 0
    stack = list(value) if isinstance(value, list) else [value]
    while stack:
        item = stack.pop()
        total += 1
        if total > limit:
            return total
        if isinstance(item, tuple):
            stack.extend(item)
    return total
