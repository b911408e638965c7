"""The lab: the simulator (`simulate/`: a labelled fault corpus written through the real sink), the
fault labels (`fault_labels`, the ground truth kept outside the store), the live replay of each
fault's telemetry (`replay`), and the fault-injection campaign: real training jobs under `faultlens
run` with faults injected at chosen ranks, steps and nodes (no change to the job's script), scored
against the expected truth of each scenario."""
