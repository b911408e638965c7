"""Dict rows -> one Arrow record batch of a table (the shape Source.poll() returns)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from faultlens.collectors.store.schema import rows_to_table


def rows_to_batch(table: str, rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    """Conform `rows` to `table`'s schema (SchemaError names the column) and return them as one
    batch.
    """
    conformed = rows_to_table(table, rows).combine_chunks()
    batches = conformed.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=conformed.schema)
    return batches[0]
