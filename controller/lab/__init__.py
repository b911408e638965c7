"""The fault-injection lab: real training jobs under `faultlens run` with faults injected at chosen ranks, steps
and nodes (no change to the job's script), scored against the expected truth of each scenario."""
