#!/usr/bin/env bash
# gpu-check.sh: run faultlens's NVML source on a real GPU for 20 s and validate what lands in the store.
# Usage: scripts/gpu-check.sh [seconds]      (needs an NVIDIA driver and nvidia-ml-py; run from the repository root)
# Exit 0 when every check passes, 1 when a check fails, 2 when the collector itself fails.
set -uo pipefail

SECONDS_TO_RUN="${1:-20}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
WORK="$(mktemp -d -t faultlens-gpu-check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
STORE="$WORK/store"

echo "== faultlens gpu-check: ${SECONDS_TO_RUN}s of the nvml source into $STORE"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version --format=csv,noheader | tee "$WORK/nvidia-smi.csv"
else
  echo "(nvidia-smi not found: GPU list not cross-checked)"
  : > "$WORK/nvidia-smi.csv"
fi

cd "$ROOT" || exit 2
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m faultlens.controller.cli.main collect \
  --store "$STORE" --node gpu-check --sources nvml --interval 1s --duration "${SECONDS_TO_RUN}s" --flush-age 5s \
  2> "$WORK/collect.err" | tee "$WORK/collect.out"
status=${PIPESTATUS[0]}
cat "$WORK/collect.err" >&2
if [ "$status" -ne 0 ]; then
  echo "FAIL: faultlens collect exited with $status" >&2
  exit 2
fi

PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$STORE" "$WORK/nvidia-smi.csv" "$WORK/collect.err" \
  "$SECONDS_TO_RUN" <<'PY'
import re
import sys

from faultlens.attribution.reading.store import Store

store_path, smi_path, err_path, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
failures = []


def check(ok, text):
    print(("ok   " if ok else "FAIL ") + text)
    if not ok:
        failures.append(text)


errors = open(err_path).read()
check("NVML unavailable" not in errors, "NVML opened (no 'NVML unavailable' message)")
store = Store(store_path)
samples = store.query("SELECT * FROM gpu_samples ORDER BY gpu_index, ts").to_pylist()
gpus = sorted({row["gpu_index"] for row in samples})
check(len(gpus) >= 1, f"samples of {len(gpus)} GPU(s) in the store")
smi = [line.split(", ") for line in open(smi_path).read().splitlines() if line.strip()]
if smi:
    check(len(gpus) == len(smi), f"GPU count matches nvidia-smi ({len(gpus)} vs {len(smi)})")
    smi_uuids = {fields[1] for fields in smi}
    check({row["gpu_uuid"] for row in samples} == smi_uuids, "GPU UUIDs match nvidia-smi")
    smi_bus = {fields[2].upper() for fields in smi}
    check({row["pci_bus_id"] for row in samples} == smi_bus, "PCI bus ids match nvidia-smi (NVML form)")
for gpu in gpus:
    rows = [row for row in samples if row["gpu_index"] == gpu]
    check(len(rows) >= 0.7 * seconds, f"GPU {gpu}: {len(rows)} samples in {seconds:.0f} s at 1 s")
    stamps = [row["ts"] for row in rows]
    check(stamps == sorted(stamps) and len(set(stamps)) == len(stamps), f"GPU {gpu}: timestamps strictly increase")
    last = rows[-1]
    check(bool(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", last["pci_bus_id"] or "")),
          f"GPU {gpu}: pci_bus_id {last['pci_bus_id']} in NVML form")
    check((last["gpu_uuid"] or "").startswith("GPU-"), f"GPU {gpu}: uuid {last['gpu_uuid']}")
    check(last["source"] == "nvml", f"GPU {gpu}: source nvml")
    check(last["temp_c"] is not None and 5 <= last["temp_c"] <= 110, f"GPU {gpu}: temperature {last['temp_c']} C")
    check(last["power_w"] is None or 1 <= last["power_w"] <= 2000, f"GPU {gpu}: power {last['power_w']} W")
    check(last["sm_clock_mhz"] is not None and last["sm_clock_mhz"] > 0, f"GPU {gpu}: SM clock {last['sm_clock_mhz']}")
    check(last["mem_total_bytes"] is not None and last["mem_total_bytes"] > 2**30,
          f"GPU {gpu}: memory total {last['mem_total_bytes']}")
    check(last["clocks_event_reasons"] is not None, f"GPU {gpu}: clocks-event reasons read")
    nulls = sorted(k for k, v in last.items() if v is None)
    print(f"     GPU {gpu}: null (not supported here): {', '.join(nulls) or 'none'}")
events = store.query("SELECT kind, count(*) AS n FROM gpu_events GROUP BY kind").to_pylist()
print("     events:", events or "none")
check(all(e["kind"] != "gpu_lost" for e in events), "no GPU lost during the check")
print(f"== {len(failures)} check(s) failed" if failures else "== all checks passed")
sys.exit(1 if failures else 0)
PY
