"""Generates the hang corpus: real dump sets of an 8-rank gloo job (worker.py), one directory per
scenario with dumps/ (the ranks' flight-recorder dumps), stacks/ (py-spy's JSON stack of each rank's
scenario thread, taken while the hang is live; absent where py-spy is not installed) and truth.json
(scenarios.py's truth plus what happened).

    python -m tests.torch_jobs.hang_corpus.generate OUT_DIR  # generate into OUT_DIR
    corpus()                                                 # what tests and the bench call: cached

Cached under $FAULTLENS_HANG_CORPUS or <tmp>/faultlens-hang-corpus-<uid>/<key>, the key a hash of
the torch version, Python, whether py-spy is there, and this package's own files; a file lock makes
concurrent callers generate it once.

How a dump is taken: every scenario runs at once; when no scenario thread on any rank has moved for
QUIET_S (each is done, stuck, or blocked in a collective), the generator asks every rank for its
dump and takes py-spy stacks of every rank, then starts phase 2 (the SIGKILL scenario) and does the
same for it; then it ends the processes.

generate(out, suite=..., suite_spec=...) runs any suite worker.py can
(tests/torch_jobs/hang_heldout: other layouts).
"""

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
import tempfile
import time
from pathlib import Path

from tests.torch_jobs.hang_corpus import scenarios as sc
from tests.torch_jobs.hang_corpus.scenarios import FAULTS_SUFFIX, WRITES_KEY
from tests.torch_jobs.harness import files_key, generated_once

REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(__file__).resolve().parent
HASHED = ("scenarios.py", "worker.py", "generate.py")
ENV_DIR = "FAULTLENS_HANG_CORPUS"
QUIET_S = 5.0  # generous: a loaded machine must not pass for a settled hang
#: and, within that spell, at least this many status reports from every live rank (0.2 s apart when
#: the rank runs freely): on a starved machine the reports stop too, so a still view alone says
#: nothing
QUIET_REPORTS = 20
START_TIMEOUT_S = 240.0
SETTLE_TIMEOUT_S = 120.0


class CorpusError(RuntimeError):
    """The corpus could not be generated: the message says which step and shows the workers' stderr
    tail.
    """


def py_spy() -> str | None:
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    return found


def cache_key() -> str:
    return files_key([PACKAGE / name for name in HASHED], b"py-spy" if py_spy() else b"no py-spy")


def corpus(root: Path | None = None) -> dict[str, Path]:
    """Scenario name -> its directory, generated once per cache key."""
    root = root or Path(
        os.environ.get(ENV_DIR)
        or Path(tempfile.gettempdir()) / f"faultlens-hang-corpus-{os.getuid()}"
    )
    final = generated_once(root, cache_key(), generate)
    return {s.name: final / s.name for s in sc.SCENARIOS}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_status(control: Path, world_size: int) -> dict[int, dict]:
    out = {}
    for rank in range(world_size):
        with contextlib.suppress(OSError, ValueError):
            out[rank] = json.loads((control / f"status_rank_{rank}.json").read_text())
    return out


def _stderr_tail(out: Path) -> str:
    parts = []
    for path in sorted((out / ".control").glob("stderr_rank_*.txt")):
        rank = path.stem.rsplit("_", 1)[-1]
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace").strip()
            if text:
                parts.append(f"[rank {rank}] {text[-800:]}")
    return "\n".join(parts) or "<empty>"


def _wait_quiet(control: Path, scenarios: list[str], procs: list[subprocess.Popen], out: Path,
                alive: set[int]) -> dict[int, dict]:
    """Until no scenario of `scenarios` moved on any live rank for QUIET_S, while every live rank
    went on reporting (QUIET_REPORTS reports each: the spell was not one in which the machine ran
    nothing)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last: dict | None = None
    since = time.monotonic()
    reports_at_since: dict[int, int] = {}
    while True:
        for rank in list(alive):
            if procs[rank].poll() is not None:
                if procs[rank].returncode != -signal.SIGKILL:
                    raise CorpusError(f"rank {rank} exited ({procs[rank].returncode}); "
                                      f"stderr:\n{_stderr_tail(out)}")
                alive = alive - {rank}  # the SIGKILL scenario's victim
        status = _read_status(control, len(procs))
        view = {r: {s: status.get(r, {}).get(s) for s in scenarios} for r in alive}
        reports = {r: int(status.get(r, {}).get(WRITES_KEY) or 0) for r in alive}
        if view != last:
            last, since, reports_at_since = view, time.monotonic(), reports
        elif (
            time.monotonic() - since >= QUIET_S
            and all(
                reports[r] - reports_at_since.get(r, reports[r]) >= QUIET_REPORTS for r in alive
            )
            and all(all(v is not None for v in view[r].values()) for r in alive)
        ):
            return status
        if time.monotonic() > deadline:
            raise CorpusError(f"scenarios {scenarios} never settled; last status {view}")
        time.sleep(0.1)


def _stacks(pid: int) -> list[dict] | None:
    tool = py_spy()
    if tool is None:
        return None
    try:
        result = subprocess.run(
            [tool, "dump", "--json", "--locals", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return json.loads(result.stdout) if result.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return None


def _dump_phase(
    phase: int, out: Path, procs: list[subprocess.Popen], alive: set[int]
) -> dict[int, list | None]:
    control = out / ".control"
    stacks = {rank: _stacks(procs[rank].pid) for rank in sorted(alive)}  # while the hang is live
    (control / f"dump_{phase}").write_text("")
    deadline = time.monotonic() + 60
    while not all((control / f"dumped_{phase}_rank_{r}").exists() for r in alive):
        if time.monotonic() > deadline:
            raise CorpusError(f"phase {phase}: dumps not written; stderr:\n{_stderr_tail(out)}")
        time.sleep(0.05)
    return stacks


def _write_stacks(out: Path, phase: int, stacks: dict[int, list | None], suite=sc) -> None:
    for s in suite.SCENARIOS:
        if s.phase != phase:
            continue
        for rank, threads in stacks.items():
            if threads is None or rank >= s.world_size:
                continue
            mine = [t for t in threads if t.get("thread_name") == f"scenario:{s.name}"]
            path = out / s.name / "stacks" / f"rank_{rank}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(mine))


def _check_faults(
    statuses: dict[str, dict[str, str]], applied: dict[str, dict[str, list]], suite=sc
) -> None:
    """Every fault happened where the scenario puts it (else the truth would not hold)."""
    problems = []
    for s in suite.SCENARIOS:
        final = statuses.get(s.name, {})
        for f in s.faults:
            state = final.get(str(f.rank), "")
            want = {"stuck": "stuck", "checkpoint": "stuck", "crash": "error: RuntimeError: "
                                                                      "injected",
                    "kill": "killed"}.get(f.kind)
            if want and not state.startswith(want):
                problems.append(f"{s.name}: rank {f.rank} should be {want!r}, is {state!r}")
            done = applied.get(s.name, {}).get(str(f.rank), [])
            if f.kind != "kill" and f"{f.kind} step {f.step} op {f.op}" not in done:
                problems.append(f"{s.name}: rank {f.rank} never carried out {f.kind} at step "
                                f"{f.step} op {f.op}")
    if problems:
        raise CorpusError("; ".join(problems))


def generate(
    out: Path, attempts: int = 2, suite=sc, suite_spec: str | None = None
) -> dict[str, Path]:
    """Generate the corpus (or `suite`, which worker.py loads by `suite_spec`) into `out`; a
    generation whose faults did not all happen is run once more."""
    for attempt in range(1, attempts + 1):
        try:
            return _generate(out, suite, suite_spec)
        except CorpusError:
            if attempt == attempts:
                raise
            shutil.rmtree(out, ignore_errors=True)
    raise AssertionError("unreachable")


def _generate(out: Path, suite=sc, suite_spec: str | None = None) -> dict[str, Path]:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    control = out / ".control"
    control.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="20000")
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(suite.WORLD_SIZE):
            err = open(control / f"stderr_rank_{rank}.txt", "wb")  # noqa: SIM115 - closed with the process
            command = [
                sys.executable,
                "-m",
                "tests.torch_jobs.hang_corpus.worker",
                str(rank),
                init,
                str(out),
                *([suite_spec] if suite_spec else []),
            ]
            procs.append(
                subprocess.Popen(
                    command,
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                )
            )
            err.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(_read_status(control, suite.WORLD_SIZE)) < suite.WORLD_SIZE:
            if any(p.poll() is not None for p in procs):
                raise CorpusError(f"a rank exited during start-up; stderr:\n{_stderr_tail(out)}")
            if time.monotonic() > deadline:
                raise CorpusError(f"ranks did not start in {START_TIMEOUT_S}s; "
                                  f"stderr:\n{_stderr_tail(out)}")
            time.sleep(0.1)
        alive = set(range(suite.WORLD_SIZE))
        statuses: dict[str, dict[str, str]] = {}
        applied: dict[str, dict[str, list]] = {}
        for phase in (1, 2):
            names = [s.name for s in suite.SCENARIOS if s.phase == phase]
            if phase == 2:
                (control / "go_2").write_text("")
                time.sleep(0.5)
            status = _wait_quiet(control, names, procs, out, alive)
            killed = {r for r in alive if procs[r].poll() is not None}
            alive -= killed
            stacks = _dump_phase(phase, out, procs, alive)
            _write_stacks(out, phase, stacks, suite)
            for s in suite.SCENARIOS:
                if s.phase != phase:
                    continue
                statuses[s.name] = {str(r): (status.get(r, {}).get(s.name) or [None, "killed"])[1]
                                    for r in range(s.world_size)}
                for r in killed:
                    if r < s.world_size:
                        statuses[s.name][str(r)] = "killed (SIGKILL)"
                applied[s.name] = {str(r): status.get(r, {}).get(s.name + FAULTS_SUFFIX, [])
                                   for r in range(s.world_size)}
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
    import torch

    _check_faults(statuses, applied, suite)
    for s in suite.SCENARIOS:
        truth = s.to_truth() | {
            "final_state": statuses.get(s.name, {}),
            "faults_carried_out": {r: v for r, v in applied.get(s.name, {}).items() if v},
            "torch": torch.__version__,
            "stacks": bool(py_spy()),
            "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        (out / s.name / "truth.json").write_text(json.dumps(truth, indent=1))
    (out / "generation.json").write_text(
        json.dumps({"seconds": round(time.monotonic() - started, 2)})
    )
    return {s.name: out / s.name for s in suite.SCENARIOS}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(__doc__)
        return 2
    started = time.monotonic()
    out = Path(args[0])
    if out.exists():
        shutil.rmtree(out)
    generate(out)
    for s in sc.SCENARIOS:
        truth = json.loads((out / s.name / "truth.json").read_text())
        print(f"{s.name:24s} culprits {truth['culprits']} final {truth['final_state']}")
    print(f"generated {len(sc.SCENARIOS)} scenarios in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
