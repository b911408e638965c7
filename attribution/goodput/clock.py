"""The accounting's clock: an instant is an integer of nanoseconds since the epoch (UTC), the unit
of the facts and of every timeline bound (integers add up exactly where float seconds would
drift); the report turns them back into datetimes. Both directions in one place, so that every
module of the accounting converts the same way."""

from __future__ import annotations

import datetime as dt
from typing import Any

from faultlens.attribution.goodput.buckets import GoodputError

NS_PER_S = 1_000_000_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def ns_of(value: Any) -> int | None:
    """An instant (an aware datetime, or nanoseconds already) as nanoseconds; a naive datetime is
    refused (its zone would be a guess)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise GoodputError(f"naive datetime {value.isoformat()}: give a timezone (UTC)")
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * NS_PER_S + delta.microseconds * 1000
    return int(value)


def datetime_of(ns: int | None) -> dt.datetime | None:
    """Nanoseconds as a UTC datetime (to the microsecond, truncated)."""
    if ns is None:
        return None
    seconds, rest = divmod(int(ns), NS_PER_S)
    return dt.datetime.fromtimestamp(seconds, dt.UTC) + dt.timedelta(microseconds=rest // 1000)
