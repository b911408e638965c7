"""Real pipeline-parallel torch jobs (8 ranks, gloo, CPU) made slow in chosen places, run once per
cache key.

    # generate into OUT_DIR
    python tests/torch_jobs/straggler_jobs.py [--sequential] OUT_DIR [CASE ...]
    # what the pytest fixture calls
    straggler_artifacts()

Two layouts: 2 replicas x 4 stages and 4 replicas x 2 stages (rank r = replica r // P, stage r % P,
two ranks per simulated node). Cases: healthy; one slow worker (from step 10); one slow stage in
every replica (from step 10); one slow replica (every stage of it, from step 10), each slowness
removed again at step 32 (the steps after it are the like-for-like run without it); and the healthy
job with a CPU hog beside it. Each case directory holds store/ (the step timer's steps and ranks
rows), timings/ (the raw per-section timer log each rank exported, and the placement) and meta.json
(layout, the injected slowness, and the measured median step time of the train steps in and outside
the slow period). The quiet cases of one layout run one after the other in one torchrun job
(train_pipeline.py's "cases"), each under its own job id and store: eight ranks importing torch cost
more CPU than a case's steps; the job's torchrun output is in its first case's directory.
`--sequential` runs every case as its own job, one at a time.

The cache is keyed by the torch version and a hash of these scripts and the collectors they run,
under a file lock (the directory of tests/torch_jobs/harness.py's cache), so a test session
generates it once.
"""

from __future__ import annotations

import concurrent.futures
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
from dataclasses import dataclass, field
from pathlib import Path

from tests.torch_jobs.harness import GenerationError, default_cache_root, files_key, generated_once

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "train_pipeline.py"
HASHED_FILES = (
    "tests/torch_jobs/train_pipeline.py",
    "tests/torch_jobs/straggler_jobs.py",
    "collectors/training/step_timer.py",
    "collectors/training/timer_model.py",
    "collectors/training/timer_writer.py",
    "collectors/store/sink.py",
    "collectors/store/schema.py",
    "collectors/store/layout.py",
)
WORLD_SIZE = 8
STEPS = 42
ONSET = 10
# the slowness is removed again at this step: the steps after it are the like-for-like "removed" run
# (the same processes, warm-up and machine load), measured on both sides of the slow period so a
# drifting load cancels
REMOVED = 32
TRANSITION = 2  # steps after a change that belong to neither side
# the job's declared length (the step timer's total_steps: its remaining time for the slowdown
# policy); a case with None declares nothing (remaining time unknown)
DECLARED_STEPS = 500_000
MICROBATCHES = 4
BASE_S = 0.01
EXTRA_S = 0.03


@dataclass(frozen=True)
class Case:
    name: str
    replicas: int
    stages: int
    slow: tuple[dict, ...] = ()
    hog: bool = False
    expected: dict = field(default_factory=dict)
    total_steps: int | None = DECLARED_STEPS
    steps: int = STEPS


def _cases() -> dict[str, Case]:
    cases = []
    for replicas, stages in ((2, 4), (4, 2)):
        tag = f"{replicas}x{stages}"
        worker_stage = stages // 2
        cases += [
            Case(
                f"worker_{tag}",
                replicas,
                stages,
                (
                    {
                        "replica": 1,
                        "stage": worker_stage,
                        "section": "forward-compute",
                        "extra_s": EXTRA_S,
                        "from_step": ONSET,
                        "to_step": REMOVED,
                    },
                ),
                expected={"kind": "worker", "ranks": [1 * stages + worker_stage]},
                # 4 x 2 declares no length: its remaining time is unknown, the slowdown is notified
                total_steps=DECLARED_STEPS if replicas == 2 else None,
            ),
            Case(
                f"stage_{tag}",
                replicas,
                stages,
                (
                    {
                        "replica": None,
                        "stage": stages - 1,
                        "section": "forward-compute",
                        "extra_s": EXTRA_S,
                        "from_step": ONSET,
                        "to_step": REMOVED,
                    },
                ),
                expected={"kind": "stage", "stage": stages - 1},
            ),
            Case(
                f"replica_{tag}",
                replicas,
                stages,
                (
                    {
                        "replica": 1,
                        "stage": None,
                        "section": "backward-compute",
                        "extra_s": EXTRA_S,
                        "from_step": ONSET,
                        "to_step": REMOVED,
                    },
                ),
                expected={
                    "kind": "replica",
                    "replica": 1,
                    "ranks": list(range(stages, 2 * stages)),
                },
            ),
        ]
    # one slow worker in replica 1 while replica 2 is held back all along by a slow pipeline link
    # (communication, no compute): fixing the worker saves only down to replica 2, the data-parallel
    # sync's next-slowest
    cases.append(Case("worker_behind_link_4x2", 4, 2,
                      ({"replica": 1, "stage": 1, "section": "forward-compute", "extra_s": EXTRA_S,
                        "from_step": ONSET, "to_step": REMOVED},
                       {"replica": 2, "stage": 0, "section": "forward-send", "extra_s": EXTRA_S / 2,
                        "from_step": 0, "background": True}),
                      expected={"kind": "worker", "ranks": [1 * 2 + 1]}))
    # nothing to remove
    cases.append(Case("hog_2x4", 2, 4, hog=True, expected={"kind": "none"}, steps=28))
    return {c.name: c for c in cases}


CASES = _cases()


def cache_key() -> str:
    return files_key([REPO_ROOT / relative for relative in HASHED_FILES])


def straggler_artifacts(cache_root: Path | None = None) -> dict[str, Path]:
    """The artifact directory of every case, generated once per cache key under a file lock."""
    final = generated_once(
        (cache_root or default_cache_root()) / "stragglers", cache_key(), generate
    )
    return {name: final / name for name in CASES}


def generate(out_dir: Path, names: list[str] | None = None, attempts: int = 2, parallel: int = 2,
             batched: bool = True) -> dict[str, Path]:
    """The quiet cases `parallel` jobs at a time (their device work is sleep, so two overlap without
    changing what they measure; start-up is what costs CPU), the CPU-hog case alone at the end.
    `batched`: the quiet cases of one layout run one after the other in one torchrun job (one
    start-up of 8 processes instead of one per case); otherwise every case is its own job (what
    bench_straggler's sequential what-if runs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(names or CASES)
    quiet = [CASES[n] for n in names if not CASES[n].hog]
    if batched:
        layouts: dict[tuple[int, int], list[Case]] = {}
        for case in quiet:
            layouts.setdefault((case.replicas, case.stages), []).append(case)
        jobs = list(layouts.values())
    else:
        jobs = [[case] for case in quiet]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for future in [pool.submit(_run_with_retries, job, out_dir, attempts) for job in jobs]:
            future.result()
    for name in names:
        if CASES[name].hog:
            _run_with_retries([CASES[name]], out_dir, attempts)
    return {name: out_dir / name for name in names}


def _run_with_retries(cases: list[Case], out_dir: Path, attempts: int) -> None:
    for attempt in range(1, attempts + 1):
        for case in cases:
            if (out_dir / case.name).exists():
                shutil.rmtree(out_dir / case.name)
        try:
            run_job(cases, out_dir)
            return
        except GenerationError:
            if attempt == attempts:
                raise


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _hog() -> list[subprocess.Popen]:
    """A CPU hog beside the job: one busy process per core."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(os.cpu_count() or 2)]


def run_job(cases: list[Case], out_dir: Path) -> None:
    """One torchrun job (8 ranks) running `cases` one after the other, all of one layout; each
    case's store, timer log and meta.json land in out_dir/<case>; the job's torchrun output in the
    first case's directory."""
    (layout,) = {(c.replicas, c.stages) for c in cases}
    arts = [out_dir / c.name for c in cases]
    for art in arts:
        art.mkdir(parents=True)
    started = time.monotonic()
    config = {
        "replicas": layout[0],
        "stages": layout[1],
        "ranks_per_node": 2,
        "cases": [
            {
                "job": f"strag-{c.name}",
                "store": str(art / "store"),
                "timings": str(art / "timings"),
                "microbatches": MICROBATCHES,
                "steps": c.steps,
                "base_s": BASE_S,
                "slow": list(c.slow),
                "total_steps": c.total_steps,
            }
            for c, art in zip(cases, arts, strict=True)
        ],
    }
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    env.pop("FAULTLENS_STORE", None)
    env.pop("FAULTLENS_JOB_ID", None)
    run_id = "strag-" + "-".join(c.name for c in cases)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(WORLD_SIZE),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{_free_port()}",
        "--rdzv-id",
        run_id[:120],
        "--max-restarts",
        "0",
        "--log-dir",
        str(arts[0] / "logdir"),
        str(SCRIPT),
        json.dumps(config),
    ]
    hogs = _hog() if any(c.hog for c in cases) else []
    try:
        with (
            open(arts[0] / "torchrun_stdout.txt", "wb") as out,
            open(arts[0] / "torchrun_stderr.txt", "wb") as err,
        ):
            process = subprocess.Popen(
                command, cwd=arts[0], env=env, stdout=out, stderr=err, start_new_session=True
            )
            try:
                returncode = process.wait(timeout=240 * len(cases))
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()
    missing = [
        c.name for c, art in zip(cases, arts, strict=True) if not (art / "store" / "steps").exists()
    ]
    if returncode != 0 or missing:
        tail = (arts[0] / "torchrun_stderr.txt").read_text(errors="replace")[-3000:]
        raise GenerationError(f"{run_id}: torchrun exit {returncode}, no steps rows for {missing}; "
                              "stderr tail:\n"
                              f"{tail}")
    seconds = round(time.monotonic() - started, 2)
    for case, art in zip(cases, arts, strict=True):
        meta = {
            "case": case.name,
            "replicas": case.replicas,
            "stages": case.stages,
            "microbatches": MICROBATCHES,
            "steps": case.steps,
            "onset": min(
                (int(s.get("from_step", 0)) for s in case.slow if not s.get("background")),
                default=None,
            ),
            "slow": list(case.slow),
            "hog": case.hog,
            "expected": dict(case.expected),
            "total_steps": case.total_steps,
            "step_time": measured_step_time(art / "store", case),
            "seconds": seconds,
            "job_cases": [c.name for c in cases],
            "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        (art / "meta.json").write_text(json.dumps(meta, indent=1))


def measured_step_time(store: Path, case: Case) -> dict:
    """Median step period (seconds between a rank's successive step ends, median over ranks) while
    slow, and without the slowness on both sides of it: before it began and after it was removed
    (the same job, past its warm-up). `removed`: the mean of the two sides (a load that drifts
    during the run cancels); `change`: slow minus removed, what removing the injected slowness
    measurably saves."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(store / "steps"), format="parquet", partitioning="hive").to_table(
        columns=["rank", "step", "end_ts"])
    frame = table.to_pandas()
    # a rank's step period: from its previous step's end to this step's end (what throughput pays)
    frame = frame.sort_values(["rank", "step"])
    frame["period"] = frame.groupby("rank")["end_ts"].diff().dt.total_seconds()
    seconds = frame[frame["step"] >= 3].groupby("step")["period"].median()
    # a standing slowness is part of both sides
    measured = [s for s in case.slow if not s.get("background")]
    onset = min((int(s.get("from_step", 0)) for s in measured), default=None)
    result = {"all": float(seconds.median())}
    if onset:
        ends = [int(s["to_step"]) for s in measured if s.get("to_step") is not None]
        removed_at = max(ends) if ends else None
        result["before"] = float(seconds[seconds.index < onset].median())
        slow = seconds[seconds.index >= onset + TRANSITION]
        if removed_at is not None:
            slow = slow[slow.index < removed_at]
            after = seconds[seconds.index >= removed_at + TRANSITION]
            result["after"] = float(after.median()) if len(after) else float("nan")
        result["slow"] = float(slow.median())
        sides = [v for v in (result["before"], result.get("after")) if v is not None and v == v]
        result["removed"] = sum(sides) / len(sides)
        result["change"] = result["slow"] - result["removed"]
    return result


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__)
        return 2
    sequential = "--sequential" in args
    args = [a for a in args if a != "--sequential"]
    out, names = Path(args[0]), args[1:] or list(CASES)
    began = time.monotonic()
    generate(out, names, parallel=1 if sequential else 2, batched=not sequential)
    for name in names:
        meta = json.loads((out / name / "meta.json").read_text())
        print(name, meta["seconds"], "s", meta["step_time"])
    print(f"generated {len(names)} cases in {time.monotonic() - began:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
