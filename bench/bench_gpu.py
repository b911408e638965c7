"""GPU collector costs: one NVML-source sample per GPU through the recorded backend, and kernel-log
lines parsed per second, each side by side with the naive alternative.

    PYTHONPATH=. python bench/bench_gpu.py [--quick]

Sampling: `NvmlSource.poll()` over the 8-GPU timeline (backend read + health deltas + one Arrow
batch per poll), against the naive shape of the same work (one Arrow table per GPU sample). The
recorded backend costs less than a real NVML query (~25 driver calls per GPU), so this is the
collector's own overhead, not NVML's. Kernel log: `KernelLogParser.feed` (all transports, every Xid
form, derived kinds) on a syslog-shaped log where 1 % of the lines are GPU lines and on one made
only of GPU lines, against one `re.search` of the common Xid shape per line (what a grep-style
collector does; it misses the old-driver, MIG, SXid and fallen-off-the-bus forms).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faultlens.collectors.sources.kmsg import KernelLogParser  # noqa: E402
from faultlens.collectors.sources.nvml_source import NvmlSource  # noqa: E402
from faultlens.collectors.sources.recorded_backend import RecordedBackend  # noqa: E402
from faultlens.collectors.sources.source import NodeIdentity  # noqa: E402
from faultlens.collectors.store.schema import rows_to_table  # noqa: E402

TIMELINE = ROOT / "tests" / "data" / "gpu" / "timeline-8gpu.yaml"
GPU_LINES = [
    "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
    "error (DBE) has "
    "been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
    "NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. MMU "
    "Fault: ENGINE "
    "GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE "
    "ACCESS_TYPE_VIRT_WRITE",
    "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid "
    "149",
    "NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to "
    "0x1 (GPU Reset "
    "Required)",
]
NOISE = [
    "systemd[1]: Started session-c12.scope - Session c12 of User slurm.",
    "mlx5_core 0000:1a:00.0: mlx5_fw_tracer_handle_traces:747:(pid 0): FW tracer event",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
    "audit: type=1400 audit(1701339481.123:456): apparmor=\"STATUS\" operation=\"profile_load\"",
]
NAIVE_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:]+)\): (\d+), (?:pid=([^,]+), "
                      r")?(?:name=([^,]+), )?(.*)")


def syslog(message: str, i: int) -> str:
    return (f"Nov 30 11:{(i // 60) % 60:02d}:{i % 60:02d} gpu-node-07 kernel: "
            f"[{8000 + i * 0.001:12.6f}] {message}")


def make_log(lines: int, gpu_share: float) -> list[str]:
    every = max(1, round(1 / gpu_share)) if gpu_share < 1 else 1
    return [syslog(GPU_LINES[i % len(GPU_LINES)] if i % every == 0 else NOISE[i % len(NOISE)], i)
            for i in range(lines)]


def best_of(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_sampling(polls: int) -> dict:
    clock = [0.0]
    source = NvmlSource(
        RecordedBackend(TIMELINE, clock=lambda: clock[0]),
        NodeIdentity("gpu-node-07"),
        monotonic=lambda: clock[0],
        events=False,
    )
    source.poll()
    gpus = len(source.devices())

    def polled():
        for i in range(polls):
            clock[0] = 0.6 + i * 1e-6  # past the thermal step, before the DBE: a steady node
            source.poll()

    ours = best_of(3, polled) / (polls * gpus)
    backend = source.backend
    devices = source.devices()
    identity = source.identity.columns()

    def naive():
        for _ in range(polls):
            for device in devices:
                reading = backend.sample(device)
                row = {
                    "ts": time.time_ns(),
                    **identity,
                    "gpu_index": device.index,
                    "gpu_uuid": device.uuid,
                    "pci_bus_id": device.pci_bus_id,
                    "source": "recorded",
                    **reading.values,
                }
                rows_to_table("gpu_samples", [row])

    naive_s = best_of(3, naive) / (polls * gpus)

    def backend_only():
        for _ in range(polls):
            for device in devices:
                backend.sample(device)

    read_s = best_of(3, backend_only) / (polls * gpus)
    source.close()
    return {"gpus": gpus, "polls": polls, "us_per_gpu_sample_poll": round(ours * 1e6, 1),
            "us_per_gpu_sample_naive_table_per_row": round(naive_s * 1e6, 1),
            "us_per_gpu_backend_read_only": round(read_s * 1e6, 1),
            "gpus_per_second_at_1s_interval_one_core": int(1 / ours)}


def bench_kmsg(lines: int) -> dict:
    results = {}
    for label, share in (("1pct_gpu_lines", 0.01), ("all_gpu_lines", 1.0)):
        log = make_log(lines, share)

        def ours(log=log):
            KernelLogParser().feed_lines(log)

        def naive(log=log):
            for line in log:
                NAIVE_RE.search(line)

        parser = KernelLogParser()
        found = len(parser.feed_lines(log))
        results[label] = {
            "lines": lines, "events": found,
            "faultlens_lines_per_s": int(lines / best_of(3, ours)),
            "naive_regex_lines_per_s": int(lines / best_of(3, naive)),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    args = parser.parse_args(argv)
    polls, lines = (50, 20_000) if args.quick else (400, 200_000)
    result = {
        "benchmark": "gpu_collectors",
        "sampling": bench_sampling(polls),
        "kernel_log": bench_kmsg(lines),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
