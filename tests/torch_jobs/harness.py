"""Runs the torch fixture scenarios (interface 6) with real torchrun and caches what they wrote.

    python tests/torch_jobs/harness.py OUT_DIR [SCENARIO ...]      # generate into OUT_DIR
    cached_artifacts()                                             # what the pytest fixture calls

Each scenario directory holds: dumps/ (flight-recorder dumps of the ranks that could write one),
logdir/ (torchrun --log-dir tree), torchrun_stderr.txt, torchrun_stdout.txt, store/ (steps and ranks
rows of the step timer), progress/ (the markers the ranks wrote before a collective that would not
complete), meta.json. Hang scenarios also have dumps_on_exit/ (dumps written on the way out of the
timeout exception); crash_exception runs with one restart, so its second attempt's dumps are in
dumps_attempt_1/.

The cache directory is keyed by a hash of the scripts and collectors they run (this harness
included) plus the torch version, and guarded by a file lock, so pytest-xdist workers and several
checkouts with the same code generate it once. Each time the cache is used, every scenario's outcome
is checked again (_check_outputs: the primary failure torch must report, the dumps and rows the
tests read; never which secondary error a survivor printed); a scenario whose cached outcome is not
the expected one is generated again, alone, so one bad run on a loaded machine never fails every
later session.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "train_scenario.py"
WORLD_SIZE = 4
#: what the cache key covers: the code that runs inside the scenarios and this harness
HASHED_FILES = (
    "tests/torch_jobs/train_scenario.py",
    "tests/torch_jobs/harness.py",
    "collectors/training/fr_trigger.py",
    "collectors/training/own_stack.py",
    "collectors/artifacts/safe_pickle.py",
    "collectors/artifacts/safe_pickle_admitted.py",
    "collectors/artifacts/safe_pickle_opcodes.py",
    "collectors/training/step_timer.py",
    "collectors/training/timer_model.py",
    "collectors/training/timer_writer.py",
    "collectors/store/sink.py",
    "collectors/store/schema.py",
    "collectors/store/layout.py",
)
ENV_CACHE_DIR = "FAULTLENS_TORCH_ARTIFACTS"
ENV_PARALLEL = "FAULTLENS_TORCH_PARALLEL"


@dataclass(frozen=True)
class Scenario:
    name: str
    culprit_ranks: tuple[int, ...]
    description: str
    timeout_s: float = 5.0  # the process-group timeout
    # how the harness asks for live dumps: 'signal', 'trigger_file' or None
    request: str | None = None
    stack_traces: bool = False
    separate_exit_dumps: bool = False  # exception dumps into dumps_on_exit/ instead of dumps/
    monitor_interval_s: float = 0.5
    max_restarts: int = 0
    expect_failure: bool = True
    expected: dict = field(default_factory=dict)
    # its step timings are the artifact: generated alone, after the others (see generate)
    timed: bool = False


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "hang",
            (2,),
            "rank 2 skips a world all_reduce and is stuck outside collectives; "
            "ranks 0, 1, 3 "
            "wait in it until the gloo timeout",
            timeout_s=6.0,
            request="signal",
            stack_traces=True,
            separate_exit_dumps=True,
            expected={"verdict": "NEVER_JOINED", "op": "gloo:all_reduce", "pg_desc": "default_pg"},
        ),
        Scenario(
            "mismatch",
            (1,),
            "rank 1 all_reduces its gradients with shape [1, n] where the "
            "others use [n]; "
            "gloo completes it, only the flight recorder shows it; dumps written at the end "
            "of the run",
            expect_failure=False,
            expected={"verdict": "SIZE_MISMATCH", "op": "gloo:all_reduce", "pg_desc": "default_pg"},
        ),
        Scenario(
            "subgroup_hang",
            (3,),
            "rank 3 skips an all_reduce in the sub-group new_group([2, "
            "3]); rank 2 "
            "waits in it, ranks 0, 1, 3 wait in the next world all_reduce",
            request="trigger_file",
            separate_exit_dumps=True,
            expected={
                "verdict": "NEVER_JOINED",
                "op": "gloo:all_reduce",
                "pg_desc": "pair_2_3",
                "pg_ranks": [2, 3],
            },
        ),
        Scenario(
            "crash_exception",
            (2,),
            "rank 2 raises ValueError in its forward section at step "
            "3, in both "
            "attempts (torchrun --max-restarts 1); survivors fail with 'Connection closed by "
            "peer'",
            monitor_interval_s=1.0,
            max_restarts=1,
            expected={"exception_type": "ValueError", "step": 3},
        ),
        Scenario(
            "crash_sigkill",
            (1,),
            "rank 1 is SIGKILLed at step 3 and writes no dump; "
            "survivors fail with "
            "'Connection closed by peer' and dump on the way out",
            monitor_interval_s=1.0,
            expected={"signal": "SIGKILL", "step": 3},
        ),
        Scenario(
            "straggler",
            (3,),
            "rank 3 sleeps 20 ms extra inside its forward section every step; no failure",
            expect_failure=False,
            expected={"section": "forward", "extra_s": 0.02},
            timed=True,
        ),
    )
}


class GenerationError(RuntimeError):
    """A scenario did not produce what it must: the message says which and shows torchrun's stderr
    tail.
    """


def files_key(files: Sequence[Path], *extra: bytes) -> str:
    """A cache key of generated torch artifacts: the generating files' names and bytes, torch's and
    Python's versions, and whatever else the generator's output depends on (`extra`)."""
    import torch

    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    for item in extra:
        digest.update(item)
    return digest.hexdigest()[:16]


def generated_once(root: Path, key: str, generate: Callable[[Path], object]) -> Path:
    """`root/key`, made by `generate` once per key under a file lock (other test processes wait for
    it); a directory left incomplete by an interrupted run is made again."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "COMPLETE").exists():
            if final.exists():
                shutil.rmtree(final)
            generate(final)
            (final / "COMPLETE").write_text(dt.datetime.now(dt.UTC).isoformat())
    return final


def cache_key() -> str:
    return files_key([REPO_ROOT / relative for relative in HASHED_FILES])


def default_cache_root() -> Path:
    configured = os.environ.get(ENV_CACHE_DIR)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"faultlens-torch-artifacts-{os.getuid()}"


def cached_artifacts(
    cache_root: Path | None = None, parallel: int | None = None
) -> dict[str, Path]:
    """The artifact directory of every scenario, generated once per cache key under a file lock."""
    root = cache_root or default_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = cache_key()
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "COMPLETE").exists():
            # generated in place (torchrun's report names files by absolute path); COMPLETE is
            # written last, so a generation that died half-way is removed and done again by the next
            # holder of the lock
            if final.exists():
                shutil.rmtree(final)
            generate(final, parallel=parallel)
            (final / "COMPLETE").write_text(dt.datetime.now(dt.UTC).isoformat())
        else:
            stale = [
                name
                for name in SCENARIOS
                if outcome_problem(SCENARIOS[name], final / name) is not None
            ]
            if stale:
                generate(final, stale, parallel=parallel)
                with open(final / "REGENERATED", "a") as log:
                    log.write(f"{dt.datetime.now(dt.UTC).isoformat()} {' '.join(stale)}\n")
    return {name: final / name for name in SCENARIOS}


def outcome_problem(scenario: Scenario, art: Path) -> str | None:
    """Why a cached scenario's outcome is not the expected one (None: it is)."""
    try:
        meta = json.loads((art / "meta.json").read_text())
        _check_outputs(scenario, art, int(meta["torchrun_exit_code"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{scenario.name}: unreadable meta.json: {exc}"
    except GenerationError as exc:
        return str(exc)
    return None


def default_parallel() -> int:
    """All scenarios at once (they mostly wait on timeouts; CPU-bound start-up overlaps), as many as
    memory allows: a scenario is five processes that import torch, about 2 GiB with headroom.
    $FAULTLENS_TORCH_PARALLEL wins."""
    configured = os.environ.get(ENV_PARALLEL, "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    try:
        available_gib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError):
        return 2
    return max(1, min(len(SCENARIOS), int(available_gib // 2)))


def generate(out_dir: Path, scenarios: Iterable[str] | None = None, parallel: int | None = None,
             attempts: int = 2) -> dict[str, Path]:
    """Run the scenarios (some at a time, a timed one alone and last) into out_dir/<scenario>; a
    scenario whose required outputs are missing (a lost race on a loaded machine) is run once more
    before GenerationError."""
    names = list(scenarios or SCENARIOS)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(parallel or default_parallel(), len(names)))
    # the long hang scenarios first, so they overlap with the short ones
    order = sorted(
        names, key=lambda n: -SCENARIOS[n].timeout_s * (1 if SCENARIOS[n].request else 0)
    )
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(_run_with_retries, SCENARIOS[n], out_dir / n, attempts): n
            for n in order
            if not SCENARIOS[n].timed
        }
        for future in concurrent.futures.as_completed(futures):
            future.result()
    # a timed scenario runs alone once the others are done: beside their torch starts on the same
    # cores one rank's own work was delayed by up to 68 ms in 9 of its first 14 steps (more than
    # the straggler's 20 ms), and the detector named it a straggler too
    for name in order:
        if SCENARIOS[name].timed:
            _run_with_retries(SCENARIOS[name], out_dir / name, attempts)
    return {name: out_dir / name for name in names}


def _run_with_retries(scenario: Scenario, art: Path, attempts: int) -> None:
    for attempt in range(1, attempts + 1):
        if art.exists():
            shutil.rmtree(art)
        try:
            run_scenario(scenario, art, generation_try=attempt)
            return
        except GenerationError:
            if attempt == attempts:
                raise


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<none>"


def run_scenario(scenario: Scenario, art: Path, generation_try: int = 1) -> Path:
    art.mkdir(parents=True)
    started = time.monotonic()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        TORCH_FR_BUFFER_SIZE="2000",
        FAULTLENS_FR_DIR=str(art / "dumps"),
        FAULTLENS_FR_TRIGGER=str(art / "fr_trigger"),
        FAULTLENS_FR_STACK_TRACES="1" if scenario.stack_traces else "0",
        FAULTLENS_FR_DUMP_ON_SIGTERM="1",
        FAULTLENS_SCENARIO_TIMEOUT_S=str(scenario.timeout_s),
        FAULTLENS_NODE="node-0",
        TORCHELASTIC_ERROR_FILE=str(art / "torchrun_error.json"),
    )
    env.pop("FAULTLENS_STORE", None)
    if scenario.separate_exit_dumps:
        env["FAULTLENS_FR_EXIT_DIR"] = str(art / "dumps_on_exit")
    else:
        env.pop("FAULTLENS_FR_EXIT_DIR", None)
    run_id = f"faultlens-{scenario.name.replace('_', '-')}"
    port = _free_port()
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
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--max-restarts",
        str(scenario.max_restarts),
        "--monitor-interval",
        str(scenario.monitor_interval_s),
        "--log-dir",
        str(art / "logdir"),
        "--tee",
        "3",
        str(SCRIPT),
        scenario.name,
        str(art),
    ]
    request: dict = {}
    with (
        open(art / "torchrun_stdout.txt", "wb") as out,
        open(art / "torchrun_stderr.txt", "wb") as err,
    ):
        process = subprocess.Popen(
            command, cwd=art, env=env, stdout=out, stderr=err, start_new_session=True
        )
        try:
            if scenario.request:
                request = _request_live_dumps(scenario, art, process)
            returncode = process.wait(timeout=120)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    meta = {
        "scenario": scenario.name,
        "description": scenario.description,
        "world_size": WORLD_SIZE,
        "culprit_ranks": list(scenario.culprit_ranks),
        "expected": dict(scenario.expected),
        "expect_failure": scenario.expect_failure,
        "torchrun_exit_code": returncode,
        "run_id": run_id,
        "node": "node-0",
        "pg_timeout_s": scenario.timeout_s,
        "max_restarts": scenario.max_restarts,
        "fault_step": 3,
        "dumps": ("live, requested by " + scenario.request) if scenario.request else (
            "end of run" if not scenario.expect_failure else "on the way out of the exception"),
        "dump_request": request,
        "stack_traces": scenario.stack_traces,
        "progress": _read_progress(art),
        "seconds": round(time.monotonic() - started, 2),
        "generation_try": generation_try,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "command": command,
    }
    meta["expected"].update(_expected_collective(scenario, meta["progress"]))
    (art / "meta.json").write_text(json.dumps(meta, indent=1))
    _check_outputs(scenario, art, returncode)
    return art


def _read_progress(art: Path) -> dict:
    progress = {}
    for path in sorted((art / "progress").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            progress[path.stem] = json.loads(path.read_text())
    return progress


def _expected_collective(scenario: Scenario, progress: dict) -> dict:
    """The collective the scenario breaks, as torch's own recorder numbered it just before (from the
    markers).
    """
    if scenario.name == "hang":
        marker = progress.get("rank_0", {})
        return {"pg_name": marker.get("group"), "collective_seq_id": marker.get("next_seq")}
    if scenario.name == "subgroup_hang":
        marker = progress.get("rank_2", {})
        follow = progress.get("rank_0", {})
        return {
            "pg_name": marker.get("group"),
            "collective_seq_id": marker.get("next_seq"),
            "follow_on": {
                "pg_name": follow.get("group"),
                "collective_seq_id": follow.get("next_seq"),
            },
        }
    if scenario.name == "mismatch":
        return {"pg_name": "0", "collective_seq_id": progress.get("mismatch", {}).get("seq")}
    return {}


def _request_live_dumps(
    scenario: Scenario, art: Path, process: subprocess.Popen, wait_s: float = 60.0
) -> dict:
    """Wait until every rank has announced it is about to block, then ask for dumps while the hang
    is live.
    """
    deadline = time.monotonic() + wait_s
    markers: dict[int, dict] = {}
    while len(markers) < WORLD_SIZE:
        if process.poll() is not None:
            raise GenerationError(f"{scenario.name}: torchrun exited ({process.returncode}) before "
                                  "the hang; "
                                  f"stderr tail:\n{_tail(art / 'torchrun_stderr.txt')}")
        if time.monotonic() > deadline:
            raise GenerationError(f"{scenario.name}: only ranks {sorted(markers)} reached the hang "
                                  f"in {wait_s}s")
        for rank in range(WORLD_SIZE):
            path = art / "progress" / f"rank_{rank}.json"
            if rank not in markers and path.exists():
                with contextlib.suppress(ValueError, OSError):
                    markers[rank] = json.loads(path.read_text())
        time.sleep(0.05)
    time.sleep(0.3)  # let the last rank get from its marker into the blocking wait
    requested = time.monotonic()
    if scenario.request == "signal":
        for marker in markers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker["pid"]), signal.SIGUSR1)
    else:
        (art / "fr_trigger").write_text(f"dump requested at {time.time()}\n")
    dumps = art / "dumps"
    while time.monotonic() - requested < scenario.timeout_s - 0.5:
        if all((dumps / f"rank_{r}.json").exists() for r in range(WORLD_SIZE)):
            break
        time.sleep(0.05)
    written = sorted(int(p.stem.split("_")[1]) for p in dumps.glob("rank_*.json"))
    return {
        "method": scenario.request,
        "ranks_written": written,
        "seconds_to_all_dumps": round(time.monotonic() - requested, 3)
        if len(written) == WORLD_SIZE
        else None,
    }


def _check_outputs(scenario: Scenario, art: Path, returncode: int) -> None:
    problems = []
    failed = returncode != 0
    if failed != scenario.expect_failure:
        problems.append(f"torchrun exit code {returncode}, expected "
                        f"{'failure' if scenario.expect_failure else 0}")
    have = {int(p.stem.split("_")[1]) for p in (art / "dumps").glob("rank_*.pkl")}
    if scenario.request:
        request = json.loads((art / "meta.json").read_text())["dump_request"]
        if request.get("seconds_to_all_dumps") is None:
            problems.append(f"live dumps were not all written before the timeout: {request}")
    if scenario.name in ("hang", "subgroup_hang", "mismatch", "straggler"):
        need = set(range(WORLD_SIZE))
    elif scenario.name == "crash_sigkill":
        need = {0, 2, 3}
        if 1 in have:
            problems.append("the SIGKILLed rank 1 has a dump")
    else:
        need = set(scenario.culprit_ranks)
    if not need <= have:
        problems.append(f"dumps missing for ranks {sorted(need - have)}")
    if scenario.name == "crash_exception":
        for attempt in range(scenario.max_restarts + 1):
            files = list((art / "logdir").glob(f"*/attempt_{attempt}/2/error.json"))
            if not files or "ValueError" not in files[0].read_text(errors="replace"):
                problems.append(f"attempt {attempt}: rank 2 did not fail with the injected "
                                "ValueError")
    stderr = _tail(art / "torchrun_stderr.txt", 200_000)
    if scenario.name == "crash_sigkill" and "Signal 9 (SIGKILL)" not in stderr:
        # the primary failure the tests read
        problems.append("torchrun did not report rank 1's SIGKILL")
    if scenario.name == "crash_exception" and "injected bug" not in stderr:
        problems.append("torchrun's output does not show rank 2's injected ValueError")
    if scenario.name != "crash_sigkill" and not (art / "store" / "steps").exists():
        # crash_sigkill's ranks may all die before a flush
        problems.append("no steps rows in the store")
    if problems:
        raise GenerationError(f"{scenario.name}: {'; '.join(problems)}; torchrun stderr tail:\n"
                              f"{_tail(art / 'torchrun_stderr.txt')}")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__)
        return 2
    out, names = Path(args[0]), args[1:] or list(SCENARIOS)
    started = time.monotonic()
    generate(out, names)
    summary = {n: json.loads((out / n / "meta.json").read_text()) for n in names}
    print(
        json.dumps(
            {
                n: {k: m[k] for k in ("torchrun_exit_code", "seconds", "dump_request", "expected")}
                for n, m in summary.items()
            },
            indent=1,
        )
    )
    print(f"generated {len(names)} scenarios in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "SCENARIOS",
    "GenerationError",
    "Scenario",
    "cached_artifacts",
    "generate",
    "run_scenario",
]
