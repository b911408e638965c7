"""One bad row never costs a whole batch: dict rows -> one Arrow batch of a table, leaving out (and
reporting) the rows that do not fit the table's schema (a value out of its column's range, text that
is not valid Unicode, ...).

The fast path converts all rows at once; only when that fails is each row converted alone to find
the bad ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from faultlens.collectors.store.batches import rows_to_batch
from faultlens.collectors.store.schema import SchemaError


@dataclass(frozen=True)
class RejectedRow:
    index: int  # position in the rows given
    line_no: int | None  # the input line the row came from, when the caller knows it
    reason: str


def guarded_batch(
    table: str, rows: Sequence[Mapping[str, Any]], line_nos: Sequence[int | None] | None = None
) -> tuple[pa.RecordBatch | None, list[RejectedRow]]:
    """(batch of the good rows or None when there is none, the rows left out). Never raises for bad
    values; an unknown table still raises SchemaError (a programming error)."""
    if not rows:
        return None, []
    try:
        return rows_to_batch(table, rows), []
    except SchemaError:
        pass
    good: list[Mapping[str, Any]] = []
    rejected: list[RejectedRow] = []
    for index, row in enumerate(rows):
        try:
            rows_to_batch(table, [row])
        except SchemaError as exc:
            line_no = line_nos[index] if line_nos is not None and index < len(line_nos) else None
            rejected.append(RejectedRow(index, line_no, str(exc)[:200]))
            continue
        good.append(row)
    if not good:
        return None, rejected
    try:
        return rows_to_batch(table, good), rejected
    except SchemaError as exc:  # pragma: no cover - each good row converted alone
        return None, [*rejected, RejectedRow(-1, None, str(exc)[:200])]
