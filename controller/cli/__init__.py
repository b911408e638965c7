"""The `faultlens` command line: a thin edge over the library; one module per command group."""
