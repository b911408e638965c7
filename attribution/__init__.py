"""faultlens central side: the store reader (DuckDB over Parquet) and the attribution engine."""
