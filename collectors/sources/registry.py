"""The source registry: node-side signal sources by name, and how `faultlens collect` builds them.

A source is registered once, by name, with a factory `factory(inputs: SourceInputs) -> Source` (a
Source class whose constructor takes the SourceInputs is its own factory). `build` calls the
factories of the chosen sources in registration order, which is also the order the node agent
polls them, each with one SourceInputs: the node identity, the collect options, and the sources
built before it (`inputs.built`). A source that needs another's view asks for it there, explicitly:
the kernel log takes the GPUs the NVML source found, so its rows carry gpu_index and uuid.
Shaped like the detector registry (attribution/detectors/base.py); the built-in sources and the
registry the CLI builds from are in builtin.py.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from faultlens.collectors.sources.source import NodeIdentity, Source
from faultlens.errors import FaultlensError

# a name is one word of `--sources a,b,c`: no comma, no space, no % (argparse's help expands it)
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class SourceInputs:
    """What sources are built from: who reports (written into every row), the options of
    `faultlens collect` (the defaults are the CLI's) and, filled in by SourceRegistry.build, the
    sources built before this one."""

    identity: NodeIdentity
    kmsg_path: str = "/dev/kmsg"  # /dev/kmsg, a log file, or a file of journalctl -k -o json
    kmsg_from_start: bool = False  # also read what the kernel log already holds
    dcgm_url: str = "http://127.0.0.1:9400/metrics"  # dcgm-exporter URL or scrape file
    nvml_timeline: Path | None = None  # a recorded GPU timeline instead of NVML (tests, demos)
    nvml_timeline_scale: float = 1.0  # stretches the timeline's times
    built: Mapping[str, Source] = field(default_factory=dict)  # by name, in build order


SourceFactory = Callable[[SourceInputs], Source]


class SourceRegistryError(FaultlensError, ValueError):
    """A source registered twice, or under a name `--sources` cannot say; a name not registered."""


class SourceRegistry:
    """Source factories by name, in registration order (the order sources are built and polled)."""

    def __init__(self) -> None:
        self._factories: dict[str, SourceFactory] = {}

    def register(self, name: str, factory: SourceFactory) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise SourceRegistryError(f"source name {name!r}: expected lower-case letters, digits, "
                                      "'-' or '_'")
        if name in self._factories:
            raise SourceRegistryError(f"source {name!r} is already registered")
        self._factories[name] = factory

    def copy(self) -> SourceRegistry:
        """A registry with the same sources, to extend without changing this one."""
        other = SourceRegistry()
        other._factories = dict(self._factories)
        return other

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def build(self, inputs: SourceInputs, names: Iterable[str] | None = None) -> tuple[Source, ...]:
        """The sources (all, or `names` in registration order), each built once; a factory's
        `inputs.built` holds the ones built before it. A factory's error is not caught: it is the
        caller's to report (a timeline that cannot be read is the CLI's exit 2)."""
        wanted = set(self._factories) if names is None else set(names)
        unknown = wanted - set(self._factories)
        if unknown:
            raise SourceRegistryError(f"no source named {', '.join(sorted(unknown))} (registered: "
                                      f"{', '.join(self._factories)})")
        built: dict[str, Source] = {}
        for name, factory in self._factories.items():
            if name in wanted:
                view = types.MappingProxyType(dict(built))
                built[name] = factory(dataclasses.replace(inputs, built=view))
        return tuple(built.values())
