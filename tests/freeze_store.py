"""Freezes the telemetry of a real run's store into a test fixture: one segment per table
(process_events, ranks, steps, heartbeats and, where the run left them, collectives), in the store
layout, rows and columns as they are.

    python -m tests.freeze_store STORE OUT_DIR [ATTEMPT]

STORE: e.g. a `faultlens campaign` scenario's store/; ATTEMPT: only that attempt's rows.

How tests/data/teardown/* were made (tests/test_follow_on.py replays them cut at every moment a row
landed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.layout import safe_value
from faultlens.collectors.store.schema import TABLES, validate

FROZEN = ("process_events", "ranks", "steps", "heartbeats", "collectives")


def freeze(store: str | Path, out: str | Path, attempt: int | None = None) -> list[Path]:
    written = []
    with Store(str(store)) as reader:
        for table in FROZEN:
            where = f" WHERE attempt = {int(attempt)}" if attempt is not None else ""
            rows = reader.query(f"SELECT * FROM {table}{where}")
            if rows.num_rows == 0:
                continue
            rows = validate(
                table, rows.select([c for c in rows.column_names if c in TABLES[table].names])
            )
            job = rows.column("job_id")[0].as_py()
            day = rows.column("ts")[0].as_py().date().isoformat()
            target = (Path(out) / table / f"job={safe_value(job)}" / f"date={day}" / "node=all"
                      / "00000000000000000001-fixture.parquet")
            target.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_batches(rows.to_batches(), rows.schema), target)
            written.append(target)
    return written


if __name__ == "__main__":
    for path in freeze(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None):
        print(path)
