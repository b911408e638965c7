"""dcgm samples whose meaning depends on the one before (Xid counts, health status, last Xid): any
pair of values, in one scrape or in consecutive scrapes, is used or is a bad line with its line
number; never an exception the parser had to contain. Found by the fuzz bench
(bench/bench_parse_fuzz.py --only dcgm): an Xid count of -Inf followed by any count raised
OverflowError (`int(count - (-inf))` in the event message), which `parse()` contained as an internal
error and counted as a bad sample of a good line."""

from __future__ import annotations

import itertools
import re

import pytest

from faultlens.collectors.sources.dcgm import DcgmParser
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.batches import rows_to_batch
from tests.conftest import DATA_DIR

NEW = DATA_DIR / "gpu" / "dcgm-exporter-new-names.prom"
IDENTITY = NodeIdentity("node-1")
TS = 1_796_000_000 * 10**9

VALUES = ["-Inf", "+Inf", "NaN", "-1e308", "1e308", "-9223372036854775809", "-1", "0", "3", "2.5"]


def _real_line(prefix: str) -> str:
    """The first real line of the scrape for the metric, with its value removed."""
    line = next(line for line in NEW.read_text().splitlines() if line.startswith(prefix + "{"))
    return line.rsplit(" ", 1)[0]


METRICS = {
    "xid_count": _real_line("DCGM_EXP_XID_ERRORS_COUNT"),
    "health": _real_line("DCGM_EXP_GPU_HEALTH_STATUS"),
    "xid_last": 'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-e2f47a98-61b3-4d5c-9f0e-8a4b7c3d2e07",'
                'pci_bus_id="00000000:BA:00.0",hostname="gpu-node-07"}',
}
# what the parser contained
INTERNAL = re.compile(r"^[A-Za-z_:][\w:]*: [A-Z]\w*(Error|Exception): ")


def _check(parser: DcgmParser, text: str, lines: int) -> None:
    before = parser.stats.bad_lines
    samples, events = parser.parse(text, IDENTITY, ts_ns=TS)
    internal = [reason for _, reason in parser.stats.bad_examples if INTERNAL.match(reason) or
                re.match(r"^[A-Z]\w*(Error|Exception): ", reason)]
    assert not internal, (text, internal)
    for line_no, _reason in parser.stats.bad_examples:
        # a bad sample names its line
        assert 1 <= line_no <= lines, (text, parser.stats.bad_examples)
    assert parser.stats.bad_lines - before <= lines
    rows_to_batch("gpu_samples", samples)  # what the parser returns always fits the tables
    rows_to_batch("gpu_events", events)
    parser.stats.bad_examples.clear()


@pytest.mark.parametrize("metric", list(METRICS))
def test_any_pair_of_values_in_one_scrape_or_two_is_used_or_a_bad_line(metric: str) -> None:
    head = METRICS[metric]
    for first, then in itertools.product(VALUES, repeat=2):
        # consecutive scrapes (the parser keeps the previous value per GPU)
        parser = DcgmParser()
        _check(parser, f"{head} {first}\n", 1)
        _check(parser, f"{head} {then}\n", 1)
        # both in one scrape, as a second GPU's line too (another UUID: state kept per GPU)
        other = head.replace('UUID="GPU-', 'UUID="GPU-f', 1)
        _check(DcgmParser(), f"{head} {first}\n{head} {then}\n{other} {then}\n", 3)


def test_negative_infinite_xid_count_is_a_bad_line_and_the_next_count_an_event() -> None:
    head = METRICS["xid_count"]
    parser = DcgmParser()
    _samples, events = parser.parse(f"{head} 1\n{head} -Inf\n", IDENTITY, ts_ns=TS)
    assert [e["code"] for e in events] == [48]
    assert parser.stats.bad_examples == [(2, "DCGM_EXP_XID_ERRORS_COUNT: Xid 48 count -inf is not "
                                             "a count")]
    _samples, events = parser.parse(f"{head} 2\n", IDENTITY, ts_ns=TS)
    # counted from the last good count (1)
    assert [e["message"].split(" Xid")[0] for e in events] == ["1"]
