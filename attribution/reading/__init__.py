"""Reading the store: the DuckDB reader (store.py), the live tail (tail.py), the windowed batch
reads (windows.py), telemetry frames (telemetry.py), the incident and decision queries every reader
shares (queries.py: one rule for which row of an incident counts), segment checks and maintenance
(compaction, retention)."""
