"""A failure's time carries its resolution: torchrun's error files and its report stamp whole
seconds (Source.WHOLE_SECONDS), the in-process exception hook stamps microseconds. The rank that
left early is judged against the first failure at that failure's own resolution, so a failure
stamped by the exception hook on a whole second (1 in 10^6, or a clock that reads .000000) is not
read as coarse, and a torchrun stamp always is."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from faultlens.attribution.detectors.crash.classify import FailureClassifier
from faultlens.attribution.rules import load_crash_rules
from faultlens.collectors.sources.process_events.rows import Source

T0 = dt.datetime(2026, 12, 8, 1, 2, 3, tzinfo=dt.UTC)


def _failure(source: str, ts: dt.datetime):  # type: ignore[no-untyped-def]
    events = pd.DataFrame([{
        "ts": pd.Timestamp(ts), "job": "j", "attempt": 0, "node": "node-1", "rank": 3,
        "kind": "exception", "source": source, "exception_type": "RuntimeError",
        "message": "boom", "traceback": None, "exit_code": None, "signal": None,
        "is_secondary": False, "fingerprint": "RuntimeError: boom",
    }])
    classifier = FailureClassifier(load_crash_rules())
    (failure,) = classifier.rank_failures(classifier.classify(events))
    return failure


@pytest.mark.parametrize("source", sorted(Source.WHOLE_SECONDS))
def test_a_torchrun_stamp_on_a_whole_second_is_coarse(source: str) -> None:
    assert _failure(source, T0).whole_second


@pytest.mark.parametrize("source", sorted(Source.WHOLE_SECONDS))
def test_a_stamp_with_microseconds_is_not_coarse_whatever_its_source(source: str) -> None:
    assert not _failure(source, T0 + dt.timedelta(microseconds=250_000)).whole_second


def test_a_fine_source_on_a_whole_second_is_not_coarse() -> None:
    fine = sorted({Source.STDERR} - Source.WHOLE_SECONDS)[0]
    assert not _failure(fine, T0).whole_second
