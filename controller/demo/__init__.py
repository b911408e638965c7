"""The demo: a real CPU training job (DDP over gloo) with injectable faults, run under the
supervisor.
"""
