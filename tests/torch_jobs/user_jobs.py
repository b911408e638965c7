"""The user scripts (tests/torch_jobs/user_scripts/) run as users run them: two torchrun launchers
(2 simulated nodes x 2 ranks, gloo, CPU; FAULTLENS_NODE names each launcher's node, the step timer
writes into FAULTLENS_STORE under FAULTLENS_JOB_ID), healthy, healthy beside a CPU hog, and with one
slow worker (an injected sleep in its forward).

    python tests/torch_jobs/user_jobs.py OUT_DIR [RUN ...]     # generate into OUT_DIR
    user_artifacts()                                            # what the pytest fixture calls

Each run directory holds store/ (steps and ranks rows), the launchers' output and meta.json. The
cache is keyed by the torch version and a hash of the scripts and the collectors they run (the
directory of tests/torch_jobs/harness.py's cache), so a test session generates it once."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.torch_jobs.harness import GenerationError, default_cache_root, files_key, generated_once

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
NODES, PER_NODE = 2, 2
HASHED_FILES = (
    "tests/torch_jobs/user_jobs.py",
    "tests/torch_jobs/user_scripts/ddp_dataloader.py",
    "tests/torch_jobs/user_scripts/pipeline_waits.py",
    "tests/torch_jobs/user_scripts/tp_dp.py",
    "collectors/training/step_timer.py",
    "collectors/training/timer_model.py",
    "collectors/training/timer_writer.py",
    "collectors/store/sink.py",
    "collectors/store/schema.py",
)
SLOW_S = 0.03


@dataclass(frozen=True)
class Run:
    name: str
    script: str
    slow_rank: int | None = None
    hog: bool = False
    steps: int = 40


#: the suite's runs, one job per shape the test names (each costs a torchrun start, ~13 s in CI):
#: the DataLoader job's worker noise and the pipeline's wait names, healthy beside a CPU hog (the
#: harder case for staying quiet), and the TP x DP job's slow worker, found. The whole family (every
#: script healthy >= 20 times, half beside a hog, and each with its slow worker) is
#: bench/bench_user_scripts.py's.
def _runs() -> dict[str, Run]:
    runs = [
        Run("ddp_dataloader-hog", "ddp_dataloader", hog=True),
        Run("pipeline_waits-hog", "pipeline_waits", hog=True),
        Run("tp_dp-slow", "tp_dp", slow_rank=3),
    ]
    return {r.name: r for r in runs}


RUNS = _runs()


def cache_key() -> str:
    return files_key([REPO_ROOT / relative for relative in HASHED_FILES])


def user_artifacts(cache_root: Path | None = None) -> dict[str, Path]:
    """The artifact directory of every run, generated once per cache key under a file lock."""
    final = generated_once(
        (cache_root or default_cache_root()) / "user-scripts", cache_key(), generate
    )
    return {name: final / name for name in RUNS}


def generate(out_dir: Path, names: list[str] | None = None, attempts: int = 2) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names or list(RUNS):
        for attempt in range(1, attempts + 1):
            shutil.rmtree(out_dir / name, ignore_errors=True)
            try:
                run(RUNS[name], out_dir / name)
                break
            except GenerationError:
                if attempt == attempts:
                    raise
    return {name: out_dir / name for name in names or RUNS}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hog() -> list[subprocess.Popen]:
    """A CPU hog beside the job: one busy process per core."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 2)
    ]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run(spec: Run, art: Path, timeout_s: float = 300.0) -> Path:
    """One run: two torchrun launchers (one per simulated node) of the script."""
    art.mkdir(parents=True)
    started = time.monotonic()
    job = f"user-{spec.name}-{int(time.time())}"
    port = _free_port()
    launchers = []
    hogs = hog() if spec.hog else []
    try:
        for node in range(NODES):
            env = dict(os.environ)
            env.update(
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
                OMP_NUM_THREADS="1",
                FAULTLENS_NODE=f"node-{node}",
                FAULTLENS_STORE=str(art / "store"),
                FAULTLENS_JOB_ID=job,
                STEPS=str(spec.steps),
                SLOW_S=str(SLOW_S),
                SLOW_RANK=str(-1 if spec.slow_rank is None else spec.slow_rank),
            )
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(NODES),
                "--node-rank",
                str(node),
                "--nproc-per-node",
                str(PER_NODE),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                job,
                "--max-restarts",
                "0",
                str(SCRIPTS / f"{spec.script}.py"),
            ]
            with open(art / f"node-{node}.out", "wb") as out:
                launchers.append(
                    subprocess.Popen(
                        command,
                        cwd=art,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        codes = [p.wait(timeout=timeout_s) for p in launchers]
    except BaseException:
        stop(launchers)
        raise
    finally:
        stop(hogs)
    if any(codes) or not (art / "store" / "steps").exists():
        tail = (art / "node-0.out").read_text(errors="replace")[-3000:]
        raise GenerationError(f"{spec.name}: exit codes {codes}; node-0 output tail:\n{tail}")
    expected = (
        []
        if spec.slow_rank is None
        else [{"rank": spec.slow_rank, "node": f"node-{spec.slow_rank // PER_NODE}"}]
    )
    meta = {
        "run": spec.name,
        "script": spec.script,
        "job": job,
        "hog": spec.hog,
        "slow": expected,
        "slow_s": SLOW_S if expected else 0.0,
        "steps": spec.steps,
        "seconds": round(time.monotonic() - started, 2),
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
    }
    (art / "meta.json").write_text(json.dumps(meta, indent=1))
    return art


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__)
        return 2
    out, names = Path(args[0]), args[1:] or list(RUNS)
    for name in names:
        began = time.monotonic()
        generate(out, [name])
        print(name, f"{time.monotonic() - began:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
