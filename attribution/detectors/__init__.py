"""detectors: see docs/architecture.md."""
