"""torch.distributed.checkpoint (DCP) directories: `.metadata` (written last by torch) and
`__<rank>_<n>.distcp` data files.

A DCP directory is complete when `.metadata` exists and every file it references exists and holds
the byte ranges the metadata points at. With torch installed the metadata is read (through a
restricted unpickler: `.metadata` is a pickle, and a checkpoint directory must never execute code);
without torch the file listing decides (the metadata present and, for every writing rank, data files
numbered 0..n without gaps). A DCP checkpoint can be loaded at any world size (DCP reshards), so a
complete one covers every rank.
"""

from __future__ import annotations

import importlib
import io
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faultlens.errors import FaultlensError

METADATA_NAME = ".metadata"
DISTCP_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")


class DcpMetadataError(ValueError, FaultlensError):
    """`.metadata` cannot be read safely: the message names the file and the problem."""


@dataclass(frozen=True)
class DcpInspection:
    complete: bool
    method: str  # "metadata" (read with torch) or "listing"
    writer_ranks: tuple[int, ...]
    referenced: Mapping[str, int]  # relative path -> bytes it must hold at least
    problem: str | None = None
    tensors: int | None = None


_ALLOWED_MODULES = {
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint._extension",
    "torch.distributed.checkpoint.planner",
}
_ALLOWED_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib", "Path"), ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Admits the DCP metadata classes (dataclasses and enums of torch.distributed.checkpoint),
    torch.Size, torch dtypes and layouts, paths and builtin containers; nothing that can run code.
    """

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _ALLOWED_MODULES:
            value = getattr(importlib.import_module(module), name, None)
            if isinstance(value, type) and (
                "__dataclass_fields__" in vars(value) or _is_enum(value)
            ):
                return value
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in DCP metadata")


def _is_enum(value: type) -> bool:
    import enum

    return issubclass(value, enum.Enum)


def torch_available() -> bool:
    try:
        importlib.import_module("torch.distributed.checkpoint.metadata")
    except ImportError:
        return False
    return True


def read_metadata(data: bytes, source: str) -> Any:
    """The torch Metadata object of a `.metadata` file, unpickled with the restricted unpickler."""
    try:
        return _RestrictedUnpickler(io.BytesIO(data)).load()
    except (
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
        ImportError,
        TypeError,
        ValueError,
        IndexError,
        KeyError,
    ) as exc:
        raise DcpMetadataError(
            f"{source}: cannot read DCP metadata: {type(exc).__name__}: {exc}"
        ) from None


def inspect_dcp(listing: Mapping[str, int], metadata: bytes | None, source: str,
                use_torch: bool | None = None) -> DcpInspection:
    """Decide completeness from the directory `listing` (name -> size) and the `.metadata` bytes."""
    writer_files: dict[int, set[int]] = {}
    for name in listing:
        match = DISTCP_RE.match(name)
        if match:
            writer_files.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    writers = tuple(sorted(writer_files))
    if metadata is None:
        return DcpInspection(False, "listing", writers, {}, problem=f"{METADATA_NAME} missing (not "
                                                                    "committed)")
    use_torch = torch_available() if use_torch is None else use_torch
    if use_torch:
        try:
            meta = read_metadata(metadata, source)
        except DcpMetadataError as exc:
            return DcpInspection(False, "metadata", writers, {}, problem=str(exc))
        storage = getattr(meta, "storage_data", None)
        if not isinstance(storage, Mapping):
            return DcpInspection(False, "metadata", writers, {}, problem=f"{source}: metadata has "
                                                                         "no storage_data")
        required: dict[str, int] = {}
        for info in storage.values():
            path = getattr(info, "relative_path", None)
            if not isinstance(path, str) or "/" in path or path.startswith("."):
                return DcpInspection(False, "metadata", writers, {},
                                     problem=f"{source}: metadata references a bad path {path!r}")
            end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
            required[path] = max(required.get(path, 0), end)
        for path, size in sorted(required.items()):
            if path not in listing:
                return DcpInspection(
                    False, "metadata", writers, required, problem=f"{path} missing"
                )
            if listing[path] < size:
                return DcpInspection(False, "metadata", writers, required,
                                     problem=f"{path} holds {listing[path]} bytes, metadata needs "
                                             f"{size}")
        tensors = len(getattr(meta, "state_dict_metadata", {}) or {})
        return DcpInspection(True, "metadata", writers, required, tensors=tensors)
    if not writers:
        return DcpInspection(False, "listing", writers, {}, problem="no __<rank>_<n>.distcp data "
                                                                    "files")
    for rank, numbers in writer_files.items():
        if numbers != set(range(len(numbers))):
            return DcpInspection(False, "listing", writers, {},
                                 problem=f"rank {rank}: data files {sorted(numbers)} have a gap")
    referenced = {name: size for name, size in listing.items() if DISTCP_RE.match(name)}
    return DcpInspection(True, "listing", writers, referenced)
