"""The built-in node-side sources, registered in the order `faultlens collect` builds and polls
them: nvml, kmsg, dcgm (the one list of every source, like gpud's components/all). REGISTRY is the
registry the CLI offers and builds from (controller/cli/gpu_cmds.py); each factory here turns the
SourceInputs into one source.

The order carries one dependency: kmsg is built after nvml and takes the GPUs the nvml source found
(when nvml is among the chosen sources), so kernel-log rows carry gpu_index and uuid.
"""

from __future__ import annotations

from faultlens.collectors.sources.dcgm import DcgmSource
from faultlens.collectors.sources.kmsg import KmsgSource
from faultlens.collectors.sources.nvml_backend import NvmlBackend
from faultlens.collectors.sources.nvml_source import NvmlSource
from faultlens.collectors.sources.recorded_backend import RecordedBackend
from faultlens.collectors.sources.registry import SourceInputs, SourceRegistry


def nvml_source(inputs: SourceInputs) -> NvmlSource:
    """GPU samples and events from NVML, or from the recorded timeline inputs.nvml_timeline."""
    if inputs.nvml_timeline is not None:
        backend = RecordedBackend(inputs.nvml_timeline, time_scale=inputs.nvml_timeline_scale)
    else:
        backend = NvmlBackend()
    return NvmlSource(backend, inputs.identity)


def kmsg_source(inputs: SourceInputs) -> KmsgSource:
    """GPU events from the kernel log, with the GPUs of the nvml source when it was built first."""
    source = KmsgSource(inputs.identity, inputs.kmsg_path, from_start=inputs.kmsg_from_start)
    gpus = inputs.built.get(NvmlSource.name)
    if isinstance(gpus, NvmlSource):
        source.set_devices(gpus.devices())
    return source


def dcgm_source(inputs: SourceInputs) -> DcgmSource:
    """GPU samples and events from a dcgm-exporter endpoint (or a scrape file)."""
    return DcgmSource(inputs.identity, inputs.dcgm_url)


REGISTRY = SourceRegistry()
REGISTRY.register(NvmlSource.name, nvml_source)
REGISTRY.register(KmsgSource.name, kmsg_source)
REGISTRY.register(DcgmSource.name, dcgm_source)
register = REGISTRY.register
