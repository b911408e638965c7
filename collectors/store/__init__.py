"""The store: the tables' schemas (schema), the partition layout and segment listing (layout), and
the one writer of crash-safe Parquet segments (sink), with the atomic file write and the
row-to-Arrow helpers they share."""
