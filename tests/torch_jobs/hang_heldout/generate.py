"""Generates the held-out hang set (scenarios.py) with the corpus' worker and generator: one launch
per suite (16 processes for MAIN, 4 for DEFAULT_ONLY), run side by side, each scenario's dumps/,
stacks/ and truth.json under <out>/<suite>/<scenario>/.

    python -m tests.torch_jobs.hang_heldout.generate OUT_DIR      # generate into OUT_DIR
    heldout()                                                     # what the tests call: cached

Cached under $FAULTLENS_HANG_HELDOUT or <tmp>/faultlens-hang-heldout-<uid>/<key>, the key a hash of
these files, the corpus worker and generator they run, torch, Python and whether py-spy is there.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.torch_jobs.hang_corpus import generate as corpus_generate
from tests.torch_jobs.hang_heldout import scenarios as hs
from tests.torch_jobs.harness import files_key, generated_once

PACKAGE = Path(__file__).resolve().parent
HASHED = (PACKAGE / "scenarios.py", PACKAGE / "generate.py",
          *(corpus_generate.PACKAGE / name for name in corpus_generate.HASHED))
ENV_DIR = "FAULTLENS_HANG_HELDOUT"


def cache_key() -> str:
    return files_key(list(HASHED), b"py-spy" if corpus_generate.py_spy() else b"no py-spy")


def _suite_dir(out: Path, spec: str) -> Path:
    return out / spec.rsplit(":", 1)[-1].lower()


def generate(out: Path) -> dict[str, Path]:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(len(hs.SUITES)) as pool:
        futures = [
            pool.submit(
                corpus_generate.generate, _suite_dir(out, spec), suite=suite, suite_spec=spec
            )
            for suite, spec in hs.SUITES
        ]
        for future in futures:
            future.result()
    (out / "generation.json").write_text(
        json.dumps({"seconds": round(time.monotonic() - started, 2)})
    )
    return paths(out)


def paths(out: Path) -> dict[str, Path]:
    return {
        s.name: _suite_dir(out, spec) / s.name for suite, spec in hs.SUITES for s in suite.SCENARIOS
    }


def heldout(root: Path | None = None) -> dict[str, Path]:
    """Scenario name -> its directory, generated once per cache key."""
    default = Path(tempfile.gettempdir()) / f"faultlens-hang-heldout-{os.getuid()}"
    root = root or Path(os.environ.get(ENV_DIR) or default)
    return paths(generated_once(root, cache_key(), generate))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(__doc__)
        return 2
    out = Path(args[0])
    if out.exists():
        shutil.rmtree(out)
    started = time.monotonic()
    for name, directory in generate(out).items():
        truth = json.loads((directory / "truth.json").read_text())
        print(f"{name:24s} culprits {truth['culprits']} final {truth['final_state']}")
    print(f"generated {len(hs.SCENARIOS)} scenarios in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
