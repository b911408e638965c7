"""Rows for any table of the schema, with every column filled (or null), for round-trip tests and
benchmarks.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pyarrow as pa

from faultlens.collectors.store.schema import schema_for

BASE_TS = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def value_for(field: pa.Field, i: int, rng: random.Random) -> Any:
    t = field.type
    if pa.types.is_timestamp(t):
        return BASE_TS + dt.timedelta(microseconds=i * 1001, seconds=rng.randint(0, 3600))
    if pa.types.is_boolean(t):
        return bool(rng.getrandbits(1))
    if pa.types.is_integer(t):
        bits = t.bit_width
        return rng.randint(-(2 ** (bits - 2)), 2 ** (bits - 2))
    if pa.types.is_floating(t):
        return float(rng.randint(0, 10_000)) / 8.0  # exactly representable in float32
    if pa.types.is_string(t):
        if field.name == "node":
            return f"node-{i % 3:02d}"
        if field.name == "job_id":
            return f"job-{i % 2}"
        return f"{field.name}-{i}-é✓"
    if pa.types.is_map(t):
        return {f"s{k}": float(k) / 4 for k in range(rng.randint(0, 3))}
    if pa.types.is_list(t):
        return [
            value_for(pa.field("x", t.value_type), i + k, rng) for k in range(rng.randint(0, 3))
        ]
    if pa.types.is_struct(t):
        return {sub.name: value_for(sub, i, rng) for sub in t}
    raise TypeError(f"no generator for {t}")


def make_rows(table: str, n: int, seed: int = 0, null_every: int = 4) -> list[dict[str, Any]]:
    """n rows; in every `null_every`-th row the nullable columns are null."""
    rng = random.Random(seed)
    schema = schema_for(table)
    rows = []
    for i in range(n):
        row = {}
        for field in schema:
            if field.nullable and null_every and i % null_every == null_every - 1:
                row[field.name] = None
            else:
                row[field.name] = value_for(field, i, rng)
        rows.append(row)
    return rows
