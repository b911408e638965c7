"""The node agent's one extension point on the source side (collectors/sources/registry.py): sources
by name, built in registration order from one SourceInputs. A new source is a class with name, poll
and close and ONE registration: `faultlens collect` then offers it (--help, --sources), builds it
after the built-in ones (it sees them in inputs.built, as kmsg sees nvml's GPUs) and stores its rows
through the real SegmentSink. A registry refuses a name twice, and the CLI an unknown name, in
today's words."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

import pyarrow as pa
import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.builtin import REGISTRY
from faultlens.collectors.sources.kmsg import KmsgSource
from faultlens.collectors.sources.nvml_source import NvmlSource
from faultlens.collectors.sources.registry import SourceInputs, SourceRegistry, SourceRegistryError
from faultlens.collectors.sources.source import NodeIdentity, Source
from faultlens.collectors.store.batches import rows_to_batch
from faultlens.controller.cli import gpu_cmds
from faultlens.controller.cli.main import build_parser, main
from faultlens.errors import FaultlensError
from tests.conftest import DATA_DIR, REPO_ROOT

TIMELINE = DATA_DIR / "gpu" / "timeline-8gpu.yaml"
KERN_LOG = DATA_DIR / "gpu" / "node-kern.log"


class PortCounterSource:
    """A newcomer, as one would add InfiniBand port counters: one gpu_events row per poll, stamped
    with the node identity and saying which sources were built before it."""

    name = "ib-ports"

    def __init__(self, inputs: SourceInputs) -> None:
        self.identity = inputs.identity
        self.after = tuple(inputs.built)
        self.polls = 0
        self.closed = False

    def poll(self) -> Mapping[str, pa.RecordBatch]:
        self.polls += 1
        row = {**self.identity.columns(), "ts": dt.datetime.now(dt.UTC), "source": self.name,
               "kind": "link_downed", "code": self.polls,
               "message": f"port 1 link_downed, built after: {','.join(self.after) or 'none'}"}
        return {"gpu_events": rows_to_batch("gpu_events", [row])}

    def close(self) -> None:
        self.closed = True


def register_newcomer(registry: SourceRegistry) -> None:
    registry.register(PortCounterSource.name, PortCounterSource)  # the one registration


# A node agent with the newcomer registered into the registry `faultlens collect` builds from.
NEWCOMER_AGENT = """
import sys
from faultlens.collectors.sources.builtin import REGISTRY
from faultlens.controller.cli.main import main
from tests.test_source_registry import register_newcomer
register_newcomer(REGISTRY)
sys.exit(main(sys.argv[1:]))
"""


def test_the_built_in_sources_are_registered_in_todays_order() -> None:
    assert REGISTRY.names() == ("nvml", "kmsg", "dcgm")
    assert gpu_cmds.REGISTRY is REGISTRY  # the registry the CLI offers and builds from
    assert build_parser("collect").parse_args(["collect"]).sources == ["nvml", "kmsg", "dcgm"]


def test_a_new_source_is_shown_by_collect_help(monkeypatch, capsys) -> None:
    registry = REGISTRY.copy()
    register_newcomer(registry)
    assert REGISTRY.names() == ("nvml", "kmsg", "dcgm")  # the copy took it, not the original
    monkeypatch.setattr(gpu_cmds, "REGISTRY", registry)
    with pytest.raises(SystemExit) as exited:
        main(["collect", "--help"])
    assert exited.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--sources SOURCES comma list of nvml, kmsg, dcgm, ib-ports (default: all)" in shown
    offered = build_parser("collect").parse_args(["collect"]).sources
    assert offered == ["nvml", "kmsg", "dcgm", "ib-ports"]  # the default: all, the newcomer too


def test_a_new_source_is_collected_into_the_store(store_dir, tmp_path) -> None:
    kern = tmp_path / "kern.log"
    shutil.copy(KERN_LOG, kern)
    result = subprocess.run(
        [sys.executable, "-c", NEWCOMER_AGENT, "collect", "--store", str(store_dir), "--node",
         "ib-box", "--sources", "ib-ports,kmsg", "--interval", "200ms", "--duration", "2s",
         "--kmsg-path", str(kern), "--kmsg-from-start"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr
    polls = int(re.search(r"on node ib-box in (\d+) polls", result.stdout).group(1))
    assert polls >= 1, result.stdout
    store = Store(str(store_dir))
    try:
        rows = store.query("SELECT node, source, code, message FROM gpu_events "
                           "WHERE source = 'ib-ports' ORDER BY code").to_pylist()
        kmsg_rows = store.query("SELECT count(*) AS n FROM gpu_events WHERE source = 'kmsg'")
    finally:
        store.close()
    # one row a poll, in the identity the CLI built; built after kmsg (registration order, not
    # the order --sources lists them in), so it saw kmsg in inputs.built
    assert [r["code"] for r in rows] == list(range(1, polls + 1))
    assert {(r["node"], r["message"]) for r in rows} == {
        ("ib-box", "port 1 link_downed, built after: kmsg")}
    assert kmsg_rows.to_pylist() == [{"n": 8}]  # the built-in source beside it goes on as before
    assert f"collected {polls + 8} gpu_events on node ib-box" in result.stdout  # both sources' rows


def test_a_source_is_registered_once() -> None:
    registry = REGISTRY.copy()
    register_newcomer(registry)
    with pytest.raises(SourceRegistryError, match="'ib-ports' is already registered") as refused:
        register_newcomer(registry)
    assert isinstance(refused.value, FaultlensError)
    with pytest.raises(SourceRegistryError, match="source 'kmsg' is already registered"):
        REGISTRY.copy().register("kmsg", PortCounterSource)
    with pytest.raises(SourceRegistryError, match="source name 'ib,ports'"):
        SourceRegistry().register("ib,ports", PortCounterSource)  # --sources could not say it
    assert registry.names() == ("nvml", "kmsg", "dcgm", "ib-ports")


@pytest.mark.parametrize(("registered", "expected"), [
    (False, "unknown source 'gpu-magic': expected a comma list of nvml, kmsg, dcgm\n"),
    (True, "unknown source 'gpu-magic': expected a comma list of nvml, kmsg, dcgm, ib-ports\n"),
])
def test_an_unknown_source_is_refused_in_todays_words(monkeypatch, capsys, store_dir, registered,
                                                      expected) -> None:
    if registered:
        registry = REGISTRY.copy()
        register_newcomer(registry)
        monkeypatch.setattr(gpu_cmds, "REGISTRY", registry)
    with pytest.raises(SystemExit) as exited:
        main(["collect", "--store", str(store_dir), "--sources", "nvml,gpu-magic"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"faultlens collect: error: argument --sources: {expected}")


def test_build_runs_in_registration_order_and_refuses_an_unknown_name() -> None:
    registry = SourceRegistry()
    seen: dict[str, tuple[str, ...]] = {}

    def factory(name: str):
        def build(inputs: SourceInputs) -> Source:
            seen[name] = tuple(inputs.built)
            source = PortCounterSource(inputs)
            source.name = name
            return source
        return build

    for name in ("first", "second", "third"):
        registry.register(name, factory(name))
    inputs = SourceInputs(NodeIdentity("node-1"))
    built = registry.build(inputs, ["third", "first"])
    assert [s.name for s in built] == ["first", "third"]
    assert all(isinstance(s, Source) for s in built)
    assert seen == {"first": (), "third": ("first",)}
    assert inputs.built == {}  # each factory saw its own view; the caller's inputs are unchanged
    refused = r"no source named ib \(registered: first, second, third\)"
    with pytest.raises(SourceRegistryError, match=refused):
        registry.build(inputs, ["ib", "first"])


def test_kmsg_takes_the_gpus_of_the_nvml_source_built_before_it(tmp_path) -> None:
    kern = tmp_path / "kern.log"
    shutil.copy(KERN_LOG, kern)
    inputs = SourceInputs(NodeIdentity("gpu-node-07"), kmsg_path=str(kern), kmsg_from_start=True,
                          nvml_timeline=TIMELINE)

    def gpu_indexes(names: list[str], types: list[type]) -> list[int | None]:
        sources = REGISTRY.build(inputs, names)
        try:
            assert [type(s) for s in sources] == types
            return sources[-1].poll()["gpu_events"].column("gpu_index").to_pylist()
        finally:
            for source in sources:
                source.close()

    # the GPU index is NVML's (a kernel-log line names a bus id and at most a UUID)
    with_gpus = gpu_indexes(["kmsg", "nvml"], [NvmlSource, KmsgSource])
    alone = gpu_indexes(["kmsg"], [KmsgSource])
    assert len(with_gpus) == len(alone) == 8
    assert set(with_gpus) == {5, 3} and alone == [None] * 8  # the DBE on GPU 5, GPU 3 lost
