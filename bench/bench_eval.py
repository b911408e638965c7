"""Attribution accuracy on a simulated, labelled corpus: the cluster simulator, the engine's batch
pass, the decision policy, and (optionally) detection latency from a live replay on the simulated
clock.

    python -m bench.bench_eval [--nodes 16] [--hours 24] [--seed 1] [--replay] [--out bench/out]

Prints one JSON line: simulator throughput (rows/s), engine batch time, and the evaluation
(precision/recall/F1 per class and for culprit nodes, cause accuracy, wrong failovers, escalation
rate, share handled without a human, detection latency) against the issue's targets. Targets are
measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from bench.common import emit, machine, peak_rss_mb, timed

TARGETS = {
    "culprit_node_f1": ">= 0.99",
    "software_failovers": "0",
    "handled_without_human": ">= 0.90",
    "crash_latency_median_s": "<= 2",
    "hang_latency_after_progress_stops_median_s": "<= 15",
}


def run(nodes: int, gpus: int, hours: float, seed: int, out: Path, replay: bool) -> dict[str, Any]:
    from faultlens.attribution.engine import attribute
    from faultlens.attribution.reading.store import Store
    from faultlens.controller.lab.evaluate import evaluate, load_decider, stands_for
    from faultlens.controller.lab.fault_labels import read_labels
    from faultlens.controller.lab.replay import replay_faults
    from faultlens.controller.lab.simulate import SimConfig, simulate

    store = out / f"eval-{nodes}x{gpus}-{hours:g}h-seed{seed}"
    if store.exists():
        shutil.rmtree(store)
    result, sim_time = timed(
        lambda: simulate(
            SimConfig(nodes=nodes, gpus_per_node=gpus, hours=hours, seed=seed), str(store)
        )
    )
    labels = read_labels(result.labels_path)
    with Store(str(store)) as opened:
        incidents, engine_time = timed(lambda: attribute(opened))
        decide, source = load_decider(opened, incidents)
        detections, replay_time = (None, None)
        if replay:
            detections, replay_time = timed(
                lambda: replay_faults(opened, labels, stands_for, workdir=out)
            )
        report = evaluate(
            labels,
            incidents,
            decide=decide,
            decisions_source=source,
            replay={k: d.detected_at for k, d in detections.items()} if detections else None,
        )
    data = report.to_json()
    rows = sum(result.rows.values())
    latency = data["latency_s"]
    measured = {
        "culprit_node_f1": data["culprit_nodes"]["f1"],
        "software_failovers": data["decisions"]["software_failovers"],
        "handled_without_human": data["decisions"]["handled_without_human"],
        "crash_latency_median_s": latency["crash"].get("median"),
        "hang_latency_after_progress_stops_median_s": latency[
            "collective_hang after progress stops"
        ].get("median"),
    }
    return {
        "corpus": {
            "nodes": nodes,
            "gpus_per_node": gpus,
            "hours": hours,
            "seed": seed,
            "faults": data["faults"],
            "faults_by_kind": result.faults_by_kind,
            "rows": result.rows,
        },
        "simulate_s": round(sim_time.wall_s, 2),
        "simulate_rows_per_s": round(rows / sim_time.wall_s),
        "engine_batch_s": round(engine_time.wall_s, 2),
        "replay_s": round(replay_time.wall_s, 1) if replay_time else None,
        "targets": TARGETS,
        "measured": measured,
        "per_class": data["per_class"],
        "detection": data["detection"],
        "culprit_nodes": data["culprit_nodes"],
        "cause_accuracy": data["cause_accuracy"],
        "decisions": data["decisions"],
        "latency_s": {
            k: {x: v.get(x) for x in ("n", "median", "p90", "max", "source")}
            for k, v in latency.items()
        },
        "by_kind": data["by_kind"],
        "false_alarms": data["false_alarms"],
        "peak_rss_mb": round(peak_rss_mb()),
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", action="store_true", help="also measure detection latency "
                                                              "(minutes)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    emit("eval", run(args.nodes, args.gpus_per_node, args.hours, args.seed, out, args.replay))


if __name__ == "__main__":
    main()
