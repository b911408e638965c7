"""Parsers of artifacts that training jobs leave behind: flight-recorder dumps (the restricted
reader and its compiled scanner, with their limits), torchrun's failure report, Python tracebacks
and their fingerprints, and per-rank timing tables users already have."""
