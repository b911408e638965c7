"""What a timed section measures: own work (compute, data), waiting for others (communication, by
collective kind), a wrapper of other sections, a phase that is not training compute, or unknown. The
names are data (rules/comm_ops.yaml, extendable by the user); see that file for the matching rules.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from faultlens import environment
from faultlens.attribution.rulefile import RuleFileError, load_rule_document
from faultlens.collectors.rule_model import FileModel, FormatVersion1, Text
from faultlens.resources import rule_file, shipped_rule_file

# the packaged file; loading reads rule_file (FAULTLENS_RULES)
DEFAULT_VOCABULARY = shipped_rule_file("comm_ops.yaml")
ENV_VOCABULARY = environment.SECTION_VOCABULARY.name
CUDA_PREFIX = "cuda/"


class SectionKind(StrEnum):
    COMPUTE = "compute"
    DATA = "data"
    COMM = "comm"
    WRAPPER = "wrapper"
    EXCLUDED = "excluded"
    UNKNOWN = "unknown"

    @property
    def own_work(self) -> bool:
        return self in (SectionKind.COMPUTE, SectionKind.DATA)


_Names = list[Text]


class _Kind(FileModel):
    kind: Literal[tuple(k.value for k in SectionKind if k is not SectionKind.UNKNOWN)]  # type: ignore[valid-type]
    op: Text | None = None
    exact: _Names | None = None
    prefixes: _Names | None = None
    patterns: _Names | None = None


class VocabularyFile(FileModel):
    """rules/comm_ops.yaml (and a user's extension of it)."""

    format_version: FormatVersion1
    kinds: list[_Kind]


class VocabularyError(RuleFileError):
    """A vocabulary file is unreadable or invalid: `<file>: <key>: <expectation>`."""


@dataclass(frozen=True)
class SectionClass:
    kind: SectionKind
    op: str | None = None  # the collective kind of a comm section (all_reduce, p2p, ...)


UNKNOWN_SECTION = SectionClass(SectionKind.UNKNOWN)


@dataclass(frozen=True)
class _Entry:
    cls: SectionClass
    exact: frozenset[str]
    prefixes: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]


class Vocabulary:
    """Classifies section names; entries of later files are tried first (a user's file overrides the
    default).
    """

    def __init__(self, entries: Sequence[_Entry], sources: Sequence[str]) -> None:
        self.entries = tuple(entries)
        self.sources = tuple(sources)
        self._cache: dict[str, SectionClass] = {}

    def classify(self, name: str) -> SectionClass:
        found = self._cache.get(name)
        if found is None:
            found = self._cache[name] = self._classify(name)
        return found

    def _classify(self, name: str) -> SectionClass:
        """A nested name's kind comes from what it is inside as well as from its last part: inside
        a communication section (`comm/loss`, `sync/grads`) it is waiting whatever its last part
        says (the user's namespace wins over a vocabulary word), inside an excluded phase
        (`eval/forward`) it is excluded; inside own work or an unknown namespace (`train/forward`,
        `timers/forward-compute`) its last part decides (`forward/recv` is communication)."""
        path = name.lower().strip()
        if path.startswith(CUDA_PREFIX):
            path = path[len(CUDA_PREFIX) :]
        parts = [p for p in path.split("/") if p] or [path]
        leaf = self._component(parts[-1])
        for part in parts[:-1]:
            outer = self._component(part)
            if outer.kind is SectionKind.EXCLUDED:
                return outer
            if outer.kind is SectionKind.COMM:
                return leaf if leaf.kind is SectionKind.COMM else outer
        return leaf

    def _component(self, leaf: str) -> SectionClass:
        for entry in self.entries:
            if leaf in entry.exact:
                return entry.cls
        for entry in self.entries:
            if leaf.startswith(entry.prefixes):
                return entry.cls
        for entry in self.entries:
            if any(p.fullmatch(leaf) for p in entry.patterns):
                return entry.cls
        return UNKNOWN_SECTION

    def scored(self, names: Iterable[str]) -> tuple[list[str], dict[str, SectionClass]]:
        """The sections to score as own work, and the class of every name. A nested section whose
        parent is present is left out (the parent holds its time; communication nested in it is
        taken out of the parent's own work by straggler.own_time); one whose parent is a wrapper
        (`forward-backward/forward-compute`) is scored, the wrapper holding no work of its own
        (never scored itself); a host-side section with a `cuda/` twin is replaced by the twin
        (GPU seconds)."""
        names = list(names)
        present = set(names)
        classes = {n: self.classify(n) for n in names}
        parents = _dash_parents(n for n in names if classes[n].kind.own_work)
        chosen = []
        for name in names:
            if not classes[name].kind.own_work or name in parents:
                continue
            path = name[len(CUDA_PREFIX) :] if name.startswith(CUDA_PREFIX) else name
            parent = path.rsplit("/", 1)[0] if "/" in path else None
            if parent is not None and any(
                held in present and classes[held].kind is not SectionKind.WRAPPER
                for held in (parent, CUDA_PREFIX + parent)
            ):
                continue
            if not name.startswith(CUDA_PREFIX) and CUDA_PREFIX + name in present:
                continue
            chosen.append(name)
        return chosen, classes


def _dash_parents(own_work: Iterable[str]) -> set[str]:
    """Own-work sections timed together with their own parts in Megatron's dash style (`optimizer`
    beside `optimizer-inner-step`, `forward` beside `forward-compute`): the parts are scored, the
    whole is left out (it holds them, and the collectives among its parts, once more)."""
    names = set(own_work)
    return {n for n in names if any(o.startswith(n + "-") for o in names if o != n)}


def _entries(document: dict[str, Any], source: str) -> list[_Entry]:
    entries = []
    for index, raw in enumerate(document["kinds"]):
        patterns = []
        for j, text in enumerate(raw.get("patterns", [])):
            try:
                patterns.append(re.compile(text.lower()))
            except re.error as exc:
                raise VocabularyError(
                    f"{source}: kinds[{index}].patterns[{j}]: expected a regular expression ({exc})"
                ) from None
        entries.append(
            _Entry(
                SectionClass(SectionKind(raw["kind"]), raw.get("op")),
                frozenset(n.lower() for n in raw.get("exact", [])),
                tuple(n.lower() for n in raw.get("prefixes", [])),
                tuple(patterns),
            )
        )
    return entries


def load_vocabulary(extra: Sequence[str | Path] = ()) -> Vocabulary:
    """The default vocabulary, then each extra file (and $FAULTLENS_SECTION_VOCABULARY,
    os.pathsep-separated) in order; later files win."""
    paths = [rule_file("comm_ops.yaml"), *(Path(p) for p in extra)]
    env = environment.SECTION_VOCABULARY.get(default="")
    paths += [Path(p) for p in env.split(os.pathsep) if p.strip()]
    return _load(tuple((str(p), _stamp(p)) for p in paths))


def _stamp(path: Path) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (0, 0)  # the loader names the file it cannot read
    return (stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _load(stamped: tuple[tuple[str, tuple[int, int]], ...]) -> Vocabulary:
    """Cached per (path, mtime, size): an edited file is read again."""
    paths = [p for p, _ in stamped]
    entries: list[_Entry] = []
    for path in reversed(paths):
        document = load_rule_document(Path(path), VocabularyFile, error=VocabularyError)
        entries.extend(_entries(document, path))
    return Vocabulary(entries, paths)
