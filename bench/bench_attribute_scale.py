"""`faultlens attribute` (batch) at cluster scale: wall, CPU and peak RSS over simulated N nodes x 8
GPUs x 24 h.

    python -m bench.bench_attribute_scale [--nodes 16 64 256] [--hours 24] [--seed 1] [--out
    bench/out/scale]
                                          [--label after] [--compare bench/out/scale/before.json]
                                          [--tree DIR]

Each store is simulated once (`faultlens simulate`, cached under --out, which is git-ignored) and
reused. For each size `faultlens attribute --store S --json` runs as its own subprocess (so its peak
RSS is its own: os.wait4 gives the child's rusage), after the store's incidents table is removed, so
every run writes the same incidents; the incidents are then read back from the store and reduced to
a canonical, sorted identity (class, job, attempt, culprit nodes, ranks and GPUs, cause, rule, first
signal, step, incident id), so that two engines can be compared run for run (--compare: a JSON
written by an earlier run). Writes <out>/<label>.json and <label>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import emit, machine

ROOT = Path(__file__).resolve().parent.parent
IDENTITY = (
    "class",
    "job_id",
    "attempt",
    "culprit_nodes",
    "culprit_ranks",
    "culprit_gpus",
    "cause",
    "rule",
    "first_signal_ts",
    "step",
    "incident_id",
)


# the checkout whose faultlens runs (--tree: e.g. an export of main, for the figures before)
TREE = ROOT


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(TREE)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "faultlens.controller.cli.main", *args]


def measured(command: list[str], log: Path) -> dict[str, Any]:
    """Run `command` as a child; its wall and CPU seconds and peak RSS (MB), from its own rusage."""
    with log.open("w") as out:
        began = time.perf_counter()
        child = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=TREE
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}); see {log}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024.0, 1)}


def store_for(
    out: Path, nodes: int, gpus: int, hours: float, seed: int
) -> tuple[Path, dict[str, Any] | None]:
    """The simulated store of one size, simulated now unless cached (a `.done` marker beside it)."""
    store = out / f"sim-{nodes}x{gpus}-{hours:g}h-seed{seed}"
    marker = store.with_suffix(".done")
    if marker.exists():
        return store, json.loads(marker.read_text())
    if store.exists():
        shutil.rmtree(store)
    figures = measured(
        _cli(
            "simulate",
            "--store",
            str(store),
            "--nodes",
            str(nodes),
            "--gpus-per-node",
            str(gpus),
            "--hours",
            f"{hours:g}",
            "--seed",
            str(seed),
            "--labels",
            str(store.with_suffix(".labels.jsonl")),
        ),
        store.with_suffix(".simulate.log"),
    )
    marker.write_text(json.dumps(figures))
    return store, figures


def canonical_incidents(store: Path) -> list[list[Any]]:
    """The store's incidents as sorted identity tuples (JSON-friendly lists)."""
    import duckdb

    files = sorted(str(p) for p in (store / "incidents").rglob("*.parquet"))
    if not files:
        return []
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    columns = ", ".join('"' + c + '"' for c in IDENTITY)
    rows = con.execute(
        f"SELECT {columns} FROM read_parquet(?, union_by_name=true)", [files]
    ).fetchall()
    con.close()
    found = {tuple(json.dumps(v, default=str) for v in row) for row in rows}
    return [list(row) for row in sorted(found)]


def run_size(out: Path, nodes: int, gpus: int, hours: float, seed: int) -> dict[str, Any]:
    store, simulated = store_for(out, nodes, gpus, hours, seed)
    # every run writes (and is measured writing) them all
    shutil.rmtree(store / "incidents", ignore_errors=True)
    figures = measured(
        _cli("attribute", "--store", str(store), "--json"), out / f"attribute-{nodes}.log"
    )
    incidents = canonical_incidents(store)
    rows = _store_rows(store)
    return {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "hours": hours,
        "seed": seed,
        "store": str(store),
        "store_mb": round(sum(p.stat().st_size for p in store.rglob("*.parquet")) / 2**20, 1),
        "rows": rows,
        "simulate": simulated,
        "attribute": figures,
        "incidents": len(incidents),
        "incident_identity": incidents,
    }


def _store_rows(store: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    rows: dict[str, int] = {}
    for table in ("steps", "gpu_samples", "process_events", "ranks", "collectives", "gpu_events"):
        rows[table] = sum(
            pq.ParquetFile(p).metadata.num_rows for p in (store / table).rglob("*.parquet")
        )
    return rows


def markdown(label: str, results: list[dict[str, Any]], compare: dict[int, dict[str, Any]]) -> str:
    lines = [f"### {label}", "", "| nodes x GPUs x h | steps rows | GPU sample rows | wall s | CPU "
                                 "s | peak RSS MB | "
             "incidents | same as before |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        a = r["attribute"]
        before = compare.get(r["nodes"])
        same = (
            "-"
            if before is None
            else ("yes" if before["incident_identity"] == r["incident_identity"] else "NO")
        )
        lines.append(f"| {r['nodes']} x {r['gpus_per_node']} x {r['hours']:g} | "
                     f"{r['rows']['steps']:,} | "
                     f"{r['rows']['gpu_samples']:,} | {a['wall_s']} | {a['cpu_s']} | "
                     f"{a['peak_rss_mb']} | "
                     f"{r['incidents']} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "scale")
    parser.add_argument("--label", default="run", help="names the result files <out>/<label>.json "
                                                       "and .md")
    parser.add_argument("--compare", type=Path, help="an earlier result JSON: are the incidents "
                                                     "the same?")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the source checkout whose `faultlens attribute` is measured "
                             "(default: this one)")
    args = parser.parse_args(argv)
    global TREE
    TREE = args.tree.resolve()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    compare: dict[int, dict[str, Any]] = {}
    if args.compare is not None:
        compare = {r["nodes"]: r for r in json.loads(args.compare.read_text())["results"]}
    results = []
    for nodes in args.nodes:
        result = run_size(args.out, nodes, args.gpus, args.hours, args.seed)
        results.append(result)
        before = compare.get(nodes)
        emit("attribute_scale", {"label": args.label, **{k: v for k, v in result.items()
                                                          if k != "incident_identity"},
                                 "same_incidents": None if before is None
                                 else before["incident_identity"] == result["incident_identity"]})
    (args.out / f"{args.label}.json").write_text(
        json.dumps(
            {"label": args.label, "tree": str(TREE), "machine": machine(), "results": results},
            indent=1,
            default=str,
        )
    )
    (args.out / f"{args.label}.md").write_text(markdown(args.label, results, compare))
    print(markdown(args.label, results, compare))
    return 0


if __name__ == "__main__":
    sys.exit(main())
