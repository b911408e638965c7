"""A restricted unpickler: only builtin containers and scalars come out of a pickle, no code runs,
and a tiny file cannot make it allocate or compute much.

Flight-recorder dumps are pickles of plain data (dict, list, tuple, str, int, float, bool, None). A
pickle can name any importable callable (GLOBAL / STACK_GLOBAL / INST / EXT*) and call it (REDUCE /
OBJ / NEWOBJ / BUILD), so an unrestricted ``pickle.load`` of a dump found on disk is arbitrary code
execution. Here:

1. A pre-pass (``check_opcodes``) walks the opcodes before the C unpickler sees them and refuses
   BUILD, INST, OBJ, NEWOBJ(_EX), STACK_GLOBAL, EXT*, persistent ids and out-of-band buffers
   outright, any length past the end of the data (a BINUNICODE8 length of 2^63 would make the
   unpickler try to allocate it), a memo index at or beyond the data's size (one 9-byte LONG_BINPUT
   would make it allocate gigabytes), strings and integers beyond the limits of
   faultlens.collectors.artifacts.fr_limits, and unknown opcodes. A regular expression skips runs of
   fixed-size opcodes, so the pass costs a fraction of the load.
2. Every global lookup goes through ``find_class``, which admits only what protocols 0-2 need to
   spell builtin values: ``set`` / ``frozenset`` (``builtins.set`` + REDUCE of a list) and ``bytes``
   (``_codecs.encode(text, 'latin1')`` or ``builtins.bytes()``). Each lookup gets a fresh checking
   callable (not the type, so NEWOBJ is refused; its attributes cannot be set, so nothing a pickle
   does outlives the load), and a callable that ends up in the loaded value instead of being called
   is refused. Everything else (``os.system``, ``builtins.eval``, any class) raises
   :class:`UnsafePickleError` before it is imported or called.
3. Strings must be valid UTF-8: the unpickler decodes with ``surrogatepass``, so a value holding an
   encoded surrogate (which could not be written anywhere as text) is refused too; the compiled
   scanner (faultlens.collectors.artifacts.fr_fastpickle) applies the same rule, so both readers
   accept and refuse the same files.

Every exception the unpickler can raise on bad data becomes a :class:`PickleLoadError` naming the
source.

The pieces: safe_pickle_admitted (the admitted types and globals, the errors, RestrictedUnpickler),
safe_pickle_opcodes (the pre-passes: check_opcodes and the tuple-hashing bound) and this module
(safe_loads and safe_load: the pre-pass, the load, the checks after it). Import everything from
here.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits
from faultlens.collectors.artifacts.safe_pickle_admitted import (
    ADMITTED_TYPES,
    PickleLoadError,
    RestrictedUnpickler,
    UnsafePickleError,
    any_escaped,
)
from faultlens.collectors.artifacts.safe_pickle_opcodes import check_opcodes


def has_surrogate(value: Any) -> bool:
    """Whether any string in `value` (keys included) holds a surrogate. Iterative, each container
    once.
    """
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, (list, tuple, dict, set, frozenset)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
    return False


def safe_loads(
    data: bytes | bytearray | memoryview, source: str = "<bytes>", limits: DumpLimits | None = None
) -> Any:
    """Unpickle `data` admitting only builtin containers and scalars. Raises UnsafePickleError for
    anything that would import, call or build code, PickleLoadError for a truncated, corrupt or
    over-limit pickle; both name `source`."""
    data = bytes(data)
    limits = limits or default_limits()
    if len(data) > limits.max_file_bytes:
        raise PickleLoadError(f"{source}: {len(data)} bytes (limit {limits.max_file_bytes})")
    try:
        walk = check_opcodes(data, limits)
    except PickleLoadError as exc:
        raise type(exc)(
            f"{source}: "
            + ("" if isinstance(exc, UnsafePickleError) else "not a valid pickle: ")
            + str(exc)
        ) from None
    # A BufferedReader lets the C unpickler prefetch through peek() instead of one read() call per
    # opcode (protocol 2 has no frames): as fast as pickle.loads.
    unpickler = RestrictedUnpickler(io.BufferedReader(io.BytesIO(data)))
    issued = unpickler.issued
    try:
        value = unpickler.load()
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{source}: {exc}") from None
    except PickleLoadError as exc:
        raise PickleLoadError(f"{source}: not a valid pickle: {exc}") from None
    except (AttributeError, TypeError) as exc:
        # NEWOBJ / OBJ applied to a builtin, or a call on a non-callable: the pickle wanted an
        # object.
        raise UnsafePickleError(
            f"{source}: refused: the pickle tried to build or call something ({str(exc)[:200]})"
        ) from None
    except RecursionError:
        raise UnsafePickleError(f"{source}: nesting too deep") from None
    except pickle.UnpicklingError as exc:
        if any(
            word in str(exc) for word in ("NEWOBJ", "class argument", "persistent", "extension")
        ):
            raise UnsafePickleError(f"{source}: refused: {str(exc)[:200]}") from None
        raise PickleLoadError(f"{source}: not a valid pickle: {str(exc)[:200]}") from None
    except EOFError:
        raise PickleLoadError(
            f"{source}: not a valid pickle: truncated (ran out of input)"
        ) from None
    except Exception as exc:  # every error a pickle can cause is this file's problem
        detail = str(exc)[:200] or type(exc).__name__
        raise PickleLoadError(
            f"{source}: not a valid pickle: {type(exc).__name__}: {detail}"
        ) from None
    finally:
        del unpickler
    if issued and any_escaped(issued):
        raise UnsafePickleError(f"{source}: refused: the pickle returns a callable instead of "
                                "calling it")
    if walk and has_surrogate(value):
        raise PickleLoadError(f"{source}: not a valid pickle: a string is not valid UTF-8 (encoded "
                              "surrogate)")
    return value


def safe_load(path: str | Path, limits: DumpLimits | None = None) -> Any:
    """safe_loads of a file's contents; errors name the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PickleLoadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return safe_loads(data, source=str(path), limits=limits)


__all__ = [
    "ADMITTED_TYPES",
    "PickleLoadError",
    "RestrictedUnpickler",
    "UnsafePickleError",
    "check_opcodes",
    "safe_load",
    "safe_loads",
]
