"""The DeviceMesh hang sets of tests/data/device-mesh-hangs: 8-rank gloo jobs (rank.py), one per
scenario, dumped while hung, in two forms (raw: torch's dump; stacks: faultlens' trigger). Truth:
the ranks given a fault.

    python -m tests.torch_jobs.device_mesh.generate OUT_DIR [SCENARIO ...]

Each job takes ~30 s (8 processes importing torch on 2 cores, then DUMP_AT seconds).
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

# name -> ((mesh shape, dim names), faults, culprits); mesh rank = sum(coord * stride), the last dim
# fastest
M3 = ([2, 2, 2], ["pp", "dp", "tp"])
S = {
    "A_tp": (M3, ["never:5:3:1"], [5]),
    "B_rs": (M3, ["never:2:3:2"], [2]),
    "C_pprecv": (M3, ["never:6:3:4"], [6]),
    "D_two_tp": (M3, ["never:1:3:1", "never:6:3:1"], [1, 6]),
    "E_first": (M3, ["never:0:0:0"], [0]),
    "F_skip": (M3, ["skip:3:2:1"], [3]),
    "H_2d42": (([4, 2], ["dp", "tp"]), ["never:3:2:1"], [3]),
    "I_2d24": (([2, 4], ["dp", "tp"]), ["never:6:2:2"], [6]),
    "J_1d": (([8], ["dp"]), ["never:4:3:3"], [4]),
    "K_dpfirst": (([2, 2, 2], ["dp", "pp", "tp"]), ["never:7:2:4"], [7]),
    "L_ppsend": (M3, ["never:1:3:4"], [1]),
    "M_skip_early": (M3, ["skip:6:0:1"], [6]),
}


def launch(
    out: str,
    dims: list[int],
    names: list[str],
    faults: list[str],
    mode: str,
    dump_at: float = 22,
    steps: int = 6,
) -> None:
    """One job: its ranks started, ended once every rank has dumped (or after DUMP_AT + 90 s)."""
    world = math.prod(dims)
    os.makedirs(out, exist_ok=True)
    rendezvous = tempfile.mkdtemp(prefix="device-mesh-")
    init = "file://" + os.path.join(rendezvous, "init")
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO_ROOT),
        WORLD=str(world),
        INIT=init,
        DIMS=",".join(map(str, dims)),
        NAMES=",".join(names),
        MODE=mode,
        OUT=out,
        FAULTS=";".join(faults),
        DUMP_AT=str(dump_at),
        STEPS=str(steps),
        OMP_NUM_THREADS="1",
    )
    procs = []
    for r in range(world):
        with open(os.path.join(out, f".err_{r}"), "w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.torch_jobs.device_mesh.rank"],
                    env=dict(env, RANK=str(r)),
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    deadline = time.time() + dump_at + 90
    while time.time() < deadline and not all(os.path.exists(os.path.join(out, f"rank_{r}.pkl"))
                                             for r in range(world)):
        time.sleep(0.2)
    time.sleep(1)
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    shutil.rmtree(rendezvous, ignore_errors=True)


def main(argv: list[str]) -> int:
    out_root = Path(argv[0])
    for name in argv[1:] or list(S):
        (dims, names), faults, truth = S[name]
        for mode in ("stacks", "raw"):
            out = out_root / mode / name
            shutil.rmtree(out, ignore_errors=True)
            launch(str(out / "dumps"), dims, names, faults, mode)
            for err in (out / "dumps").glob(".err_*"):
                err.unlink()
            truth_doc = {"culprits": truth, "world_size": math.prod(dims), "mesh_shape": dims,
                         "mesh_dim_names": names, "faults": faults}
            (out / "truth.json").write_text(json.dumps(truth_doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
