"""Generates the skip-before-history sets (shapes.py): one real gloo job (job.py) per shape, its
ranks as processes on this machine; every rank dumps in both forms when its collective times out.
Out: <out>/<form>/<shape>/dumps/rank_N.pkl (form raw or repaired), <out>/<form>/<shape>/truth.json
and <out>/<shape>/errors/rank_N.txt (the last line of each rank's own exception).

    python -m tests.torch_jobs.skip_history.generate OUT_DIR [SHAPE ...]
    skip_sets()                        # what the tests and the bench call: cached

Cached under $FAULTLENS_SKIP_HISTORY or <tmp>/faultlens-skip-history-<uid>/<key>, the key a hash of
this package's files, the trigger that writes the repaired form, torch and Python. A run in which a
rank did not fail on its own timeout (a loaded machine can stall a healthy collective past it) is
run again.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.torch_jobs.harness import files_key, generated_once
from tests.torch_jobs.skip_history.shapes import BY_NAME, FORMS, SHAPES, Shape

REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(__file__).resolve().parent
HASHED = (
    PACKAGE / "shapes.py",
    PACKAGE / "job.py",
    PACKAGE / "generate.py",
    REPO_ROOT / "collectors" / "training" / "fr_trigger.py",
)
ENV_DIR = "FAULTLENS_SKIP_HISTORY"
#: every group's gloo timeout (the rendezvous' is long: job.py); a healthy collective a starved
#: process makes time out is a run to do again
TIMEOUT_S = 15.0
WAIT_S = 400.0  # for every rank's dumps (start-up of 8 processes on a loaded machine)


class SkipSetError(RuntimeError):
    """A shape's job did not end as it must; the message names it and shows the ranks' stderr."""


def _launch(shape: Shape, out: Path, timeout_s: float) -> str | None:
    """Run the shape's job once into `out`; a problem (None: every rank timed out and dumped)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rendezvous = tempfile.mkdtemp(prefix="skip-history-")
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO_ROOT),
        SHAPE=shape.name,
        OUT=str(out),
        INIT="file://" + os.path.join(rendezvous, "init"),
        TIMEOUT_S=str(timeout_s),
        OMP_NUM_THREADS="1",
        TORCH_FR_BUFFER_SIZE="2000",
    )
    procs = []
    for rank in range(shape.world):
        with open(out / f"stderr_{rank}.txt", "w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.torch_jobs.skip_history.job"],
                    env=dict(env, RANK=str(rank)),
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    cwd=REPO_ROOT,
                )
            )
    errors = [out / f"error_{rank}.txt" for rank in range(shape.world)]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not all(e.exists() for e in errors):
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    for proc in procs:
        proc.kill()
        proc.wait()
    shutil.rmtree(rendezvous, ignore_errors=True)
    missing = [e.name for e in errors if not e.exists()]
    if missing:
        tails = "".join(
            f"\n--- rank {r}:\n{(out / f'stderr_{r}.txt').read_text()[-1500:]}"
            for r in range(shape.world)
        )
        return f"{shape.name}: no timeout dump ({', '.join(missing)}){tails}"
    for error in errors:  # its own timeout, or a peer's that closed their connection
        if not any(text in error.read_text() for text in ("Timed out waiting", "closed by peer")):
            return f"{shape.name}: {error.name} is no wait's end:\n{error.read_text()[-800:]}"
    return None


def _arrange(shape: Shape, run: Path, out: Path) -> None:
    for form in FORMS:
        target = out / form / shape.name
        shutil.rmtree(target, ignore_errors=True)
        (target / "dumps").mkdir(parents=True)
        for rank in range(shape.world):
            shutil.copyfile(run / form / f"rank_{rank}.pkl", target / "dumps" / f"rank_{rank}.pkl")
        (target / "truth.json").write_text(json.dumps(shape.truth(), indent=1) + "\n")
    errors = out / shape.name / "errors"
    errors.mkdir(parents=True, exist_ok=True)
    for rank in range(shape.world):  # the exception's own line: what the rank's exit says
        lines = [line for line in (run / f"error_{rank}.txt").read_text().splitlines() if line]
        (errors / f"rank_{rank}.txt").write_text(lines[-1] + "\n")


def generate_shape(
    shape: Shape, out: Path, attempts: int = 3, timeout_s: float = TIMEOUT_S
) -> None:
    """The shape's sets into `out` (both forms, its truth, each rank's exception)."""
    run = out / ".runs" / shape.name
    problem = None
    for _ in range(attempts):
        problem = _launch(shape, run, timeout_s)
        if problem is None:
            _arrange(shape, run, out)
            shutil.rmtree(run, ignore_errors=True)
            return
    raise SkipSetError(problem)


def generate(out: Path, names: list[str] | None = None, parallel: int = 3) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    shapes = [BY_NAME[n] for n in names] if names else list(SHAPES)
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        for future in [pool.submit(generate_shape, s, out) for s in shapes]:
            future.result()
    shutil.rmtree(out / ".runs", ignore_errors=True)
    return paths(out)


def paths(out: Path) -> dict[str, Path]:
    """'<form>/<shape>' -> its directory (dumps/, truth.json)."""
    return {f"{form}/{s.name}": out / form / s.name for form in FORMS for s in SHAPES}


def cache_key() -> str:
    return files_key(list(HASHED))


def skip_sets(root: Path | None = None) -> dict[str, Path]:
    """Every shape in both forms, generated once per cache key."""
    default = Path(tempfile.gettempdir()) / f"faultlens-skip-history-{os.getuid()}"
    root = root or Path(os.environ.get(ENV_DIR) or default)
    return paths(generated_once(root, cache_key(), generate))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    started = time.monotonic()
    generate(Path(argv[0]), argv[1:] or None)
    print(f"generated in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
