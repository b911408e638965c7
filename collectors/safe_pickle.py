"""A restricted unpickler: only builtin containers and scalars come out of a pickle, and no code runs.

Flight-recorder dumps are pickles of plain data (dict, list, tuple, str, int, float, bool, None). A pickle can
name any importable callable (GLOBAL / STACK_GLOBAL / INST / EXT*) and call it (REDUCE / OBJ / NEWOBJ / BUILD), so
an unrestricted ``pickle.load`` of a dump found on disk is arbitrary code execution. Here every global lookup goes
through ``find_class``, which admits only what protocols 0-2 need to spell builtin values:

- ``set`` / ``frozenset`` (protocol < 4 writes a set as ``builtins.set`` + REDUCE of a list),
- ``bytes`` (protocol < 3 writes bytes as ``_codecs.encode(text, 'latin1')``, or ``builtins.bytes()`` when empty).

Each is handed back as a small checking function, not the type itself, so NEWOBJ (which needs a type) is refused and
REDUCE cannot reach ``bytes(10**12)`` or a codec other than latin-1. Everything else (``os.system``, ``builtins.eval``,
any class) raises :class:`UnsafePickleError` before it is imported or called; persistent ids are refused too. BUILD
on a builtin container fails inside the unpickler (builtins have no ``__setstate__`` or ``__dict__``) and is reported
as refused. With no global resolvable, the opcodes can only produce the builtin values themselves (protocol 5's
BYTEARRAY8 gives a bytearray; out-of-band buffers are refused since none are passed), so the loaded value is not
walked again (that walk would cost four times the load).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

ADMITTED_TYPES: tuple[type, ...] = (dict, list, tuple, set, frozenset, str, bytes, bytearray, int, float, bool,
                                    type(None))


class PickleLoadError(ValueError):
    """A pickle could not be loaded: truncated, corrupt or refused. The message names the source."""


class UnsafePickleError(PickleLoadError):
    """The pickle asked for something other than builtin containers and scalars (a global, a call, an object)."""


def _make_set(items: Any = ()) -> set:
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise UnsafePickleError(f"set() argument must be a list or tuple, got {type(items).__name__}")
    return set(items)


def _make_frozenset(items: Any = ()) -> frozenset:
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise UnsafePickleError(f"frozenset() argument must be a list or tuple, got {type(items).__name__}")
    return frozenset(items)


def _make_bytes(*args: Any) -> bytes:
    if not args:
        return b""
    if len(args) == 1 and isinstance(args[0], (bytes, list)) and all(isinstance(b, int) for b in args[0]):
        return bytes(args[0])
    raise UnsafePickleError("bytes() is admitted only empty or from a byte list")


def _latin1_encode(text: Any, encoding: Any = "utf-8", *rest: Any) -> bytes:
    if rest or not isinstance(text, str) or str(encoding).lower().replace("_", "-") not in ("latin1", "latin-1"):
        raise UnsafePickleError("_codecs.encode is admitted only as encode(str, 'latin1') (protocol 2 bytes)")
    return text.encode("latin-1")


_ADMITTED_GLOBALS: dict[tuple[str, str], Any] = {}
for _module in ("builtins", "__builtin__"):
    _ADMITTED_GLOBALS[(_module, "set")] = _make_set
    _ADMITTED_GLOBALS[(_module, "frozenset")] = _make_frozenset
    _ADMITTED_GLOBALS[(_module, "bytes")] = _make_bytes
_ADMITTED_GLOBALS[("_codecs", "encode")] = _latin1_encode


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves no global beyond the builtin-value helpers above."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ADMITTED_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafePickleError(f"refused global {module}.{name}: only builtin containers and scalars are "
                                    "admitted") from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused persistent id: only builtin containers and scalars are admitted")


def safe_loads(data: bytes | bytearray | memoryview, source: str = "<bytes>") -> Any:
    """Unpickle `data` admitting only builtin containers and scalars. Raises UnsafePickleError for anything that
    would import or call code, PickleLoadError for a truncated or corrupt pickle; both name `source`."""
    # A BufferedReader lets the C unpickler prefetch through peek() instead of one read() call per opcode
    # (protocol 2 has no frames): as fast as pickle.loads.
    unpickler = RestrictedUnpickler(io.BufferedReader(io.BytesIO(bytes(data))))
    try:
        value = unpickler.load()
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{source}: {exc}") from None
    except (AttributeError, TypeError) as exc:
        # BUILD / NEWOBJ / OBJ applied to a builtin, or a call on a non-callable: the pickle wanted an object.
        raise UnsafePickleError(f"{source}: refused: the pickle tried to build or call something ({exc})") from None
    except RecursionError:
        raise UnsafePickleError(f"{source}: nesting too deep") from None
    except pickle.UnpicklingError as exc:
        if any(word in str(exc) for word in ("NEWOBJ", "class argument", "persistent", "extension")):
            raise UnsafePickleError(f"{source}: refused: {exc}") from None
        raise PickleLoadError(f"{source}: not a valid pickle: {exc}") from None
    except (EOFError, ValueError, IndexError, KeyError, MemoryError, OverflowError,
            UnicodeDecodeError) as exc:
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, EOFError):
            detail = "truncated (ran out of input)"
        raise PickleLoadError(f"{source}: not a valid pickle: {detail}") from None
    return value


def safe_load(path: str | Path) -> Any:
    """safe_loads of a file's contents; errors name the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PickleLoadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return safe_loads(data, source=str(path))
