"""CPU per dump of the flight-recorder reader, old code against new, alternating (wall time on a
shared machine is noise; CPU seconds per dump are not).

    PYTHONPATH=. python bench/bench_fr_read_cpu.py --old /tmp/baseline --new . --rounds 3

Each run is a fresh subprocess with PYTHONPATH set to the checkout it measures (`faultlens` resolves
there): it warms the numba kernels on a few dumps, then reads DIR the way bench_hang times it
(`read_dump_dir(d, columns=COLUMNS, dictionary=True, max_frames=0)`) and prints wall, process CPU
(all threads) and CPU ms per dump. DIR defaults to the 4,096-rank synthetic set of bench_hang
(generate it first: see that module).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO_ROOT / "bench" / "out" / "fr-dumps" / "ranks4096-entries2000-v2"

_CHILD = r"""
import json, os, resource, shutil, sys, tempfile, time
from pathlib import Path
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.attribution.detectors.hang import COLUMNS

directory = Path(sys.argv[1])
warm = tempfile.mkdtemp()
for path in sorted(directory.iterdir())[:4]:
    if path.name.startswith("_dump_"):
        shutil.copy(path, warm)
read_dump_dir(warm, columns=COLUMNS, dictionary=True, max_frames=0, fast_path=True)
shutil.rmtree(warm)
cpu0, wall0 = time.process_time(), time.perf_counter()
dumps = read_dump_dir(directory, columns=COLUMNS, dictionary=True, max_frames=0)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
n = len(dumps.ranks)
print(
    json.dumps(
        {
            "dumps": n,
            "rows": dumps.table.num_rows,
            "errors": len(dumps.errors),
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "cpu_ms_per_dump": round(1000 * cpu / n, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "load_avg": os.getloadavg()[0],
        }
    )
)
"""


def measure(root: Path, directory: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root.resolve()))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory.resolve())],
        env=env,
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True, help="checkout of the old code")
    parser.add_argument("--new", type=Path, default=REPO_ROOT, help="checkout of the new code "
                                                                    "(default: this one)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="dump set to read")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        for label, root in (("old", args.old), ("new", args.new)):
            result = measure(root, args.dir)
            results[label].append(result)
            print(label, json.dumps(result), flush=True)
    for label, runs in results.items():
        per_dump = sorted(r["cpu_ms_per_dump"] for r in runs)
        walls = sorted(r["wall_s"] for r in runs)
        print(f"{label}: CPU ms/dump median {per_dump[len(per_dump) // 2]} (all {per_dump}); wall "
              f"s {walls}")


if __name__ == "__main__":
    main()
