"""dcgm-exporter scrapes (Prometheus text, from a file or an HTTP URL) -> gpu_samples and
gpu_events.

Metric names: both DCGM's old and new field names are accepted (DCGM 4.6 renamed XID_ERRORS ->
XID_ERROR, ROW_REMAP_FAILURE -> ROW_REMAP_FAILED, RETIRED_* -> PAGE_RETIRED_*,
CLOCK_THROTTLE_REASONS -> CLOCKS_EVENT_REASONS). Labels: `gpu` (index), `UUID` (or `uuid` in the old
namespace), `pci_bus_id`, `modelName`, `hostname` or `Hostname` (renamed in May 2026), MIG labels
ignored for device fields. Values >= 9223372036854775792 are DCGM's blank sentinels: no data (null).
Events: XID_ERRORS (a gauge holding the last Xid: reported when it changes),
DCGM_EXP_XID_ERRORS_COUNT (per-Xid count in a window: reported when it rises),
DCGM_EXP_GPU_HEALTH_STATUS (WARN/FAIL with a DCGM_FR_* code mapped to a gpu_events kind), and
changes between scrapes of the same GPU (gpu_deltas).

Lines are parsed with prometheus_client's parser; a scrape that does not parse as a whole is parsed
line by line, bad lines counted and skipped. Nothing raises into the agent.

The modules, in reading order: metrics (the vocabulary: metric names -> columns, health codes ->
kinds, blank sentinels, value ranges), samples (a scrape's text into samples, the parse counts),
parser (DcgmParser: samples into rows and events), fetch (a scrape's text from a URL or file),
source (DcgmSource, the node agent's Source) and read (read_scrape, the one-shot import).
"""

from __future__ import annotations

from faultlens.collectors.sources.dcgm.fetch import DcgmFetchError, fetch_scrape
from faultlens.collectors.sources.dcgm.metrics import (
    DCGM_BLANK_MIN,
    HEALTH_KINDS,
    HEALTH_METRIC,
    HEALTH_WORDS,
    MAX_SCRAPE_CHARS,
    MIB,
    SAMPLE_METRICS,
    XID_COUNT_METRIC,
    XID_LAST_METRICS,
)
from faultlens.collectors.sources.dcgm.parser import DcgmParser
from faultlens.collectors.sources.dcgm.read import read_scrape
from faultlens.collectors.sources.dcgm.samples import MAX_LINE_CHARS, DcgmStats
from faultlens.collectors.sources.dcgm.source import DcgmSource

__all__ = [
    "DCGM_BLANK_MIN",
    "HEALTH_KINDS",
    "HEALTH_METRIC",
    "HEALTH_WORDS",
    "MAX_LINE_CHARS",
    "MAX_SCRAPE_CHARS",
    "MIB",
    "SAMPLE_METRICS",
    "XID_COUNT_METRIC",
    "XID_LAST_METRICS",
    "DcgmFetchError",
    "DcgmParser",
    "DcgmSource",
    "DcgmStats",
    "fetch_scrape",
    "read_scrape",
]
