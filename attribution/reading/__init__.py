"""Reading the store: the DuckDB reader (store.py), the live tail (tail.py), the windowed batch reads
(windows.py), telemetry frames (telemetry.py), segment checks and maintenance (compaction, retention)."""
