"""The straggler judgment on users' own jobs (issue 33) as a benchmark: healthy runs of the user
scripts (tests/torch_jobs/user_scripts/: a DDP job with a DataLoader worker, a pipeline with the
user's wait names, TP x DP sub-groups; 2 simulated nodes x 2 ranks, gloo, CPU), half of them beside
a CPU hog, must raise no incident of any class; one slow worker per script must be named with its
node at the failover threshold; Megatron-style traces (tests/megatron_trace.py, the shapes of
tests/test_straggler_megatron.py) must name their slow worker at the failover threshold and raise
nothing when healthy. With --anchor DIR (a tree of an earlier commit: `git archive REV | tar -x -C
DIR`) the same stores are attributed by that code too, in the same run.

    PYTHONPATH=. python bench/bench_user_scripts.py --healthy 20 --out DIR [--anchor DIR]
    [--reuse DIR] [--no-docs]

Runs go one at a time (each is 4 ranks in 2 torchrun launchers)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import Figure, Section, emit, write_section  # noqa: E402

SECTION = "Stragglers on users' own jobs: user scripts and Megatron-shaped traces"
SCRIPTS = ("ddp_dataloader", "pipeline_waits", "tp_dp")
SLOW_RANK = {"ddp_dataloader": 2, "pipeline_waits": 1, "tp_dp": 3}

ATTRIBUTE = """
import json, sys
from faultlens.attribution.engine import attribute
for store in sys.argv[1:]:
    print(json.dumps([store, [[i.incident_class.value, i.rule, i.confidence, list(i.culprit_ranks),
                               list(i.culprit_nodes)] for i in attribute(store)]]), flush=True)
"""


def attribute_all(stores: list[Path], tree: Path) -> dict[str, list[list]]:
    """Every incident of each store as the code in `tree` attributes it (one process per tree)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-c", ATTRIBUTE, *map(str, stores)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
    )
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("["):
            store, incidents_ = json.loads(line)
            found[store] = incidents_
    return found


def failover_threshold() -> float:
    from faultlens.attribution.incident import IncidentClass
    from faultlens.attribution.policy import load_policy

    return load_policy().threshold_for(IncidentClass.STRAGGLER)


def commit() -> str:
    return (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        or "-"
    )


def user_runs(out: Path, healthy: int, reuse: bool) -> list[tuple[str, Path, dict]]:
    from tests.torch_jobs.user_jobs import Run, run

    specs = [
        Run(
            f"healthy-{i:02d}-{SCRIPTS[i % 3]}{'-hog' if i % 2 else ''}",
            SCRIPTS[i % 3],
            hog=bool(i % 2),
        )
        for i in range(healthy)
    ]
    specs += [Run(f"slow-{s}", s, slow_rank=SLOW_RANK[s]) for s in SCRIPTS]
    done = []
    for spec in specs:
        art = out / spec.name
        if not (reuse and (art / "meta.json").exists()):
            if art.exists():
                subprocess.run(["rm", "-rf", str(art)], check=True)
            run(spec, art)
        done.append((spec.name, art, json.loads((art / "meta.json").read_text())))
        print(spec.name, "done", flush=True)
    return done


def traces(out: Path) -> list[tuple[str, Path, object]]:
    from tests.megatron_trace import ingest
    from tests.test_straggler_megatron import HEALTHY, SLOW

    made = []
    for group, cases in (("slow", SLOW), ("healthy", HEALTHY)):
        for name, trace in cases.items():
            directory = out / "traces" / f"{group}-{name}"
            if not (directory / "store").exists():
                ingest(trace, directory)
            made.append((f"{group}-{name}", directory / "store", trace))
    return made


def judge_runs(runs, tree: Path, found: dict[str, list[list]]) -> dict:

    def incidents(store: Path, _tree: Path) -> list[list]:
        return found[str(store)]

    threshold = failover_threshold()
    healthy = [(n, a) for n, a, m in runs if not m["slow"]]
    quiet = sum(1 for n, a in healthy if not incidents(a / "store", tree))
    hog = [(n, a) for n, a, m in runs if not m["slow"] and m["hog"]]
    quiet_hog = sum(1 for n, a in hog if not incidents(a / "store", tree))
    named = 0
    for _, art, meta in runs:
        if not meta["slow"]:
            continue
        got = incidents(art / "store", tree)
        (slow,) = meta["slow"]
        named += (
            len(got) == 1
            and got[0][3] == [slow["rank"]]
            and got[0][4] == [slow["node"]]
            and got[0][2] >= threshold
        )
    slow_total = sum(1 for *_, m in runs if m["slow"])
    return {
        "healthy": len(healthy),
        "quiet": quiet,
        "hog": len(hog),
        "quiet_hog": quiet_hog,
        "slow": slow_total,
        "found": named,
    }


def judge_traces(made, tree: Path, threshold: float, found: dict[str, list[list]]) -> dict:

    def incidents(store: Path, _tree: Path) -> list[list]:
        return found[str(store)]

    named, confidences, quiet, healthy = 0, [], 0, 0
    for _name, store, trace in made:
        got = incidents(store, tree)
        if trace.slow is None:
            healthy += 1
            quiet += not got
            continue
        want = trace.global_rank(*trace.slow)
        ok = len(got) == 1 and got[0][3] == [want] and got[0][2] >= threshold
        named += ok
        confidences += [got[0][2]] if ok else []
    slow = sum(1 for _, _, t in made if t.slow is not None)
    return {
        "slow": slow,
        "named": named,
        "healthy": healthy,
        "quiet": quiet,
        "confidence": (min(confidences), max(confidences)) if confidences else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--healthy", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true", help="keep runs already in --out")
    parser.add_argument("--anchor", type=Path, default=None, help="a tree of an earlier commit")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="user-scripts-"))
    out.mkdir(parents=True, exist_ok=True)
    threshold = failover_threshold()
    runs = user_runs(out, args.healthy, args.reuse)
    made = traces(out)
    stores = [art / "store" for _, art, _ in runs] + [store for _, store, _ in made]
    found = attribute_all(stores, REPO)
    now = judge_runs(runs, REPO, found), judge_traces(made, REPO, threshold, found)
    before = None
    if args.anchor:
        found_before = attribute_all(stores, args.anchor)
        before = (
            judge_runs(runs, args.anchor, found_before),
            judge_traces(made, args.anchor, threshold, found_before),
        )
    emit("user_scripts", {"now": now, "anchor": before})
    rev = commit()
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    anchor_rev = (
        (args.anchor / ".commit").read_text().strip()
        if args.anchor and (args.anchor / ".commit").exists()
        else "the earlier commit"
    )

    def vs(before_text: str | None) -> dict:
        return {"anchor": f"{anchor_rev}: {before_text}" if before_text else "-"}

    r, t = now
    rb, tb = before if before else (None, None)
    figures = (
        Figure(
            "healthy user-script runs with no incident (any class, notify included)",
            f"{r['quiet']} of {r['healthy']}",
            "all (>= 20)",
            **vs(rb and f"{rb['quiet']} of {rb['healthy']}"),
            commit=rev,
            date=date,
        ),
        Figure(
            "... of them beside a CPU hog",
            f"{r['quiet_hog']} of {r['hog']}",
            "all",
            **vs(rb and f"{rb['quiet_hog']} of {rb['hog']}"),
            commit=rev,
            date=date,
        ),
        Figure(
            "slow worker named with its node at the failover threshold, one per script",
            f"{r['found']} of {r['slow']}",
            "all",
            **vs(rb and f"{rb['found']} of {rb['slow']}"),
            commit=rev,
            date=date,
        ),
        Figure(
            "Megatron-shaped traces: slow worker named alone at >= 0.7",
            f"{t['named']} of {t['slow']} (confidence "
            f"{t['confidence'][0]:.2f}-{t['confidence'][1]:.2f})"
            if t["confidence"]
            else f"{t['named']} of {t['slow']}",
            "all",
            **vs(tb and f"{tb['named']} of {tb['slow']}"),
            commit=rev,
            date=date,
        ),
        Figure(
            "Megatron-shaped traces, healthy: no incident",
            f"{t['quiet']} of {t['healthy']}",
            "all",
            **vs(tb and f"{tb['quiet']} of {tb['healthy']}"),
            commit=rev,
            date=date,
        ),
    )
    section = Section(
        SECTION,
        "Compares: faultlens' straggler judgment on the user scripts of tests/torch_jobs/"
        "user_scripts/ (2 simulated nodes x 2 ranks, gloo, CPU, 40 steps; healthy runs cycle "
        "through the three scripts, every second one beside a CPU hog of one busy process per "
        "core; a slow worker sleeps 30 ms more in its forward every step) and on the Megatron-"
        "shaped traces of tests/test_straggler_megatron.py (1F1B, rows every N steps, one "
        "reporting rank per tensor-parallel group, steps up to 46.6 s), against the code before "
        "issue 33 on the same stores in the same run.",
        (
            "git archive 2610163 | tar -x -C $TMPDIR/before",
            "PYTHONPATH=. python bench/bench_user_scripts.py --healthy 20 --out $TMPDIR/us "
            "--anchor $TMPDIR/before",
        ),
        figures,
        (
            "A slow worker counts as found when it is the only incident, names that rank and its "
            "node, at confidence >= the policy's straggler threshold (0.7).",
            "Runs on the shared 2-core machine (load average 30-40 from other work beside it).",
        ),
    )
    if not args.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", section)
    print(json.dumps({"now": now, "anchor": before}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
