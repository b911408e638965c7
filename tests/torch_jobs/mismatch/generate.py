"""The completed-mismatch sets of tests/data/completed-mismatch: real gloo jobs (rank.py) in which
some ranks call one collective with another shape or dtype of the same byte count; gloo completes
it and the job goes on. Dumped after the last step, in two forms (raw: torch's dump; repaired:
faultlens' trigger). Truth: the odd ranks, the collective, no hang.

    python -m tests.torch_jobs.mismatch.generate OUT_DIR [SCENARIO ...]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

# name -> (world, odd ranks, group name the mismatch is in, op)
S = {
    "broadcast_shape_4": (4, [3], "world", "broadcast"),
    "all_reduce_dtype_4": (4, [2], "world", "all_reduce"),
    "pair_broadcast_shape_8": (8, [5], "pair_2", "broadcast"),
    "broadcast_shape_8": (8, [6, 7], "world", "broadcast"),
}


def launch(out: str, scenario: str, world: int, odd: list[int], mode: str) -> None:
    os.makedirs(out, exist_ok=True)
    rendezvous = tempfile.mkdtemp(prefix="mismatch-")
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO_ROOT),
        WORLD=str(world),
        INIT="file://" + os.path.join(rendezvous, "init"),
        OUT=out,
        SCENARIO=scenario.rsplit("_", 1)[0],
        ODD=",".join(map(str, odd)),
        MODE=mode,
        OMP_NUM_THREADS="1",
        TORCH_FR_BUFFER_SIZE="2000",
    )
    procs = []
    for r in range(world):
        with open(os.path.join(out, f".err_{r}"), "w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.torch_jobs.mismatch.rank"],
                    env=dict(env, RANK=str(r)),
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    deadline = time.time() + 120
    while time.time() < deadline and not all(
        os.path.exists(os.path.join(out, f"rank_{r}.pkl")) for r in range(world)
    ):
        time.sleep(0.2)
    for p in procs:
        p.kill()
        p.wait()
    shutil.rmtree(rendezvous, ignore_errors=True)


def main(argv: list[str]) -> int:
    out_root = Path(argv[0])
    for name in argv[1:] or list(S):
        world, odd, group, op = S[name]
        for mode in ("repaired", "raw"):
            out = out_root / mode / name
            shutil.rmtree(out, ignore_errors=True)
            launch(str(out / "dumps"), name, world, odd, mode)
            for err in (out / "dumps").glob(".err_*"):
                if err.stat().st_size == 0:
                    err.unlink()
            truth = {
                "odd_ranks": odd,
                "world_size": world,
                "group": group,
                "op": op,
                "hang": False,
                "mismatch_step": 1,
            }
            (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
