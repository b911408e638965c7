"""One-shot import of a scrape (`faultlens ingest dcgm FILE|URL`): its rows and parse counts, or
DcgmFetchError.
"""

from __future__ import annotations

from typing import Any

from faultlens.collectors.sources.dcgm.fetch import DcgmFetchError, fetch_scrape
from faultlens.collectors.sources.dcgm.parser import DcgmParser
from faultlens.collectors.sources.dcgm.samples import DcgmStats
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch


def read_scrape(
    location: str, identity: NodeIdentity, *, host_from_labels: bool = True, timeout_s: float = 5.0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], DcgmStats]:
    """One-shot import of a scrape. Raises DcgmFetchError when it cannot be read or holds no dcgm
    metric.
    """
    text = fetch_scrape(location, timeout_s=timeout_s)
    parser = DcgmParser()
    samples, events = parser.parse(text, identity, host_from_labels=host_from_labels)
    kept = {}
    for table, rows in (("gpu_samples", samples), ("gpu_events", events)):
        _, rejected = guarded_batch(table, rows)
        for row in rejected:
            parser.count_bad(0, f"{table} row refused: {row.reason}")
        refused = {row.index for row in rejected}
        kept[table] = [row for index, row in enumerate(rows) if index not in refused]
    samples, events = kept["gpu_samples"], kept["gpu_events"]
    if not samples and not events:
        stats = parser.stats
        detail = (
            (
                f"{stats.bad_lines} bad line(s), first at line {stats.bad_examples[0][0]}: "
                f"{stats.bad_examples[0][1]}"
            )
            if stats.bad_examples
            else "no DCGM_FI_* / DCGM_EXP_* GPU metric"
        )
        raise DcgmFetchError(f"dcgm {location}: not a dcgm-exporter scrape: {detail}")
    return samples, events, parser.stats
