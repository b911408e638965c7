"""Straggler scoring at scale beside the implementation it replaces, and the what-if estimate
against measured step-time changes of real torch jobs.

    # 1,024 ranks x 500 steps, scoring (default)
    python bench/bench_straggler.py
    # also: what-if vs measured on the real pipeline jobs
    python bench/bench_straggler.py --torch
    # the what-if alone (DIR: jobs generated before)
    python bench/bench_straggler.py --whatif-only [--reuse DIR]

Scoring: a simulated job (controller/lab/simulate/straggler_cases.py: 128 nodes x 8 GPUs, 4 stages,
32 replicas, one slow GPU from step 200) is written to a store once (cached under --cache) and read
into a Telemetry bundle; timed is the detector's scoring of the 500-step window (scores + findings:
decomposition, persistence, what-if), best of --repeat, wall and CPU seconds, beside the previous
detector (attribution/straggler.py at commit BASELINE, since split into the package
attribution/detectors/straggler/; read from git, with its substring exclusion list) on the same
frames. The culprit each one reports is printed.

What-if: each slow case of tests/torch_jobs/straggler_jobs.py is run one at a time (--sequential,
into --cache); the job measures its own median step period while slow and without the slowness,
before it starts and after it is removed again (the same job, warm-up and load; the mean of both
sides); the estimate is the incident's "fixing this saves" in seconds, beside the pipeline model
alone (whatif.sync_arrivals false, the estimate before). Mind the machine: timings are only as good
as the machine is idle.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.common import machine  # noqa: E402

BASELINE = "a0f761f"
OLD_EXCLUDE = ("comm", "allreduce", "all_reduce", "sync", "wait", "barrier", "checkpoint")


def _legacy_detector(thresholds, cache: Path):
    source = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", f"{BASELINE}:attribution/straggler.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = cache / "legacy_straggler.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("legacy_straggler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["legacy_straggler"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.StragglerDetector(thresholds.model_copy(update={"exclude_sections": OLD_EXCLUDE}))


def _best(fn, repeat: int) -> tuple[object, float, float]:
    best_wall = best_cpu = float("inf")
    result = None
    for _ in range(repeat):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = fn()
        best_wall = min(best_wall, time.perf_counter() - wall0)
        best_cpu = min(best_cpu, time.process_time() - cpu0)
    return result, best_wall, best_cpu


def bench_scoring(cache: Path, nodes: int, steps: int, repeat: int) -> dict:
    from faultlens.attribution.detectors.straggler import StragglerDetector
    from faultlens.attribution.reading.store import Store
    from faultlens.attribution.reading.telemetry import load_from_store, placements
    from faultlens.attribution.rules import load_thresholds
    from faultlens.controller.lab.simulate.straggler_cases import write_case

    store = cache / f"sim-worker-{nodes}x8-{steps}"
    if not (store / "steps").exists():
        shutil.rmtree(store, ignore_errors=True)
        write_case(str(store), "worker", nodes=nodes, steps=steps, onset=steps * 2 // 5, seed=1)
    thresholds = load_thresholds().straggler
    with Store(str(store)) as handle:
        telemetry = load_from_store(handle)
    rows = telemetry.steps
    placement = placements(telemetry.ranks, 0, rows)
    new = StragglerDetector(thresholds)
    old = _legacy_detector(thresholds, cache)

    def score_new():
        scores = new.scores(rows, placement, telemetry.ranks, 0)
        return new.findings(scores, placement)

    def score_old():
        scores = old.scores(rows, placement)
        return old.findings(scores, placement)

    found_new, wall_new, cpu_new = _best(score_new, repeat)
    found_old, wall_old, cpu_old = _best(score_old, repeat)
    return {
        "ranks": nodes * 8,
        "steps": int(rows["step"].nunique()),
        "rows": len(rows),
        "faultlens_wall_s": round(wall_new, 3),
        "faultlens_cpu_s": round(cpu_new, 3),
        "previous_wall_s": round(wall_old, 3),
        "previous_cpu_s": round(cpu_old, 3),
        "speedup_cpu": round(cpu_old / cpu_new, 2) if cpu_new else None,
        "faultlens_found": [
            (f.kind, f.ranks[:8], round(f.whatif.saving_fraction, 3) if f.whatif else None)
            for f in found_new
        ],
        "previous_found": [(f.kind, f.ranks[:8]) for f in found_old],
    }


def bench_whatif(cache: Path, reuse: Path | None = None) -> list[dict]:
    """Per slow case: the change the job measured when its slowness was removed (the same job before
    the slowness and after it was removed, steps_jobs.measured_step_time), the estimate with the
    data-parallel sync from the observed arrivals (now), and the pipeline model alone
    (whatif.sync_arrivals false: the estimate before)."""
    from faultlens.attribution.engine import Engine, attribute
    from faultlens.attribution.rules import load_thresholds
    from faultlens.collectors.sources.xid_catalog import load_xid_catalog
    from tests.torch_jobs.straggler_jobs import CASES, generate

    names = [n for n in CASES if not CASES[n].hog]
    if reuse is None:
        out = cache / "torch-sequential"
        shutil.rmtree(out, ignore_errors=True)
        generate(out, names, parallel=1, batched=False)
    else:
        out = reuse
    thresholds = load_thresholds()
    straggler = thresholds.straggler
    model_only = thresholds.model_copy(update={"straggler": straggler.model_copy(
        update={"whatif": straggler.whatif.model_copy(update={"sync_arrivals": False})})})
    engines = {"estimate": Engine(catalog=load_xid_catalog()),
               "model_only": Engine(catalog=load_xid_catalog(), thresholds=model_only)}
    results = []
    for name in names:
        art = out / name
        meta = json.loads((art / "meta.json").read_text())
        measured = meta["step_time"]["change"]
        row = {
            "case": name,
            "measured_change_s": round(measured, 4),
            "removed_s": round(meta["step_time"]["removed"], 4),
            "slow_s": round(meta["step_time"]["slow"], 4),
            "before_only_change_s": round(
                meta["step_time"]["slow"] - meta["step_time"]["before"], 4
            ),
        }
        for label, engine in engines.items():
            store = cache / f"whatif-{name}"
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(art / "store", store)
            found = [i for i in attribute(str(store), engine=engine) if i.details.get("whatif")]
            if found:
                whatif = found[0].details["whatif"]
                estimate = whatif["step_s"] - whatif["ideal_s"]
                row[f"{label}_s"] = round(estimate, 4)
                row[f"{label}_error"] = round(estimate / measured - 1, 3) if measured else None
                row.setdefault("microbatches", whatif["microbatches"])
                row.setdefault("rule", found[0].rule)
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torch", action="store_true", help="also measure the what-if on the real "
                                                             "torch jobs")
    parser.add_argument("--cache", default=str(REPO_ROOT / "bench" / "out" / "stragglers"))
    parser.add_argument("--whatif-only", action="store_true", help="skip the scoring bench")
    parser.add_argument("--reuse", help="analyse jobs generated before into this directory "
                                        "(straggler_jobs.py "
                                        "--sequential DIR) instead of running them")
    args = parser.parse_args(argv)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "straggler",
        "machine": machine(),
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "scoring": None
        if args.whatif_only
        else bench_scoring(cache, args.nodes, args.steps, args.repeat),
    }
    if args.torch or args.whatif_only:
        report["whatif"] = bench_whatif(cache, Path(args.reuse) if args.reuse else None)
    print(json.dumps(report, indent=1, default=str))
    s = report["scoring"]
    if s:
        print(
            f"\n| scoring {s['ranks']} ranks x {s['steps']} steps | wall s | CPU s "
            "|\n|---|---|---|\n"
            f"| faultlens | {s['faultlens_wall_s']} | {s['faultlens_cpu_s']} |\n"
            f"| previous detector ({BASELINE}) | {s['previous_wall_s']} | {s['previous_cpu_s']} |"
        )
    if report.get("whatif"):
        print("\n| case | measured s | estimate s | error | pipeline model alone s | error |\n"
              "|---|---|---|---|---|---|")
    for row in report.get("whatif", []):
        print(f"| {row['case']} | {row['measured_change_s']} | {row.get('estimate_s')} | "
              f"{row.get('estimate_error')} "
              f"| {row.get('model_only_s')} | {row.get('model_only_error')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
