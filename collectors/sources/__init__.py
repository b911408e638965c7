"""Node-side signal sources: the Source protocol (source), the source registry (registry; the
built-in sources registered in order in builtin), the node agent that polls them (agent), and one
module or package per source or backend: NVML and DCGM GPUs, the recorded GPU timeline, the kernel
log, rank processes, Python stacks; plus the rule data they read (XID catalog, process error rules)
and the OpenTelemetry export."""
