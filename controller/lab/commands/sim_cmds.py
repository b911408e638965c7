"""`faultlens simulate` (a labelled fault corpus written through the real sink) and `faultlens eval`
(scores the engine's incidents and decisions against the labels)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from faultlens.controller.cli.common import CliError, add_store_arg, emit, json_default


def register(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser(
        "simulate", help="simulate a training cluster with injected faults (store + labels file)",
        description="Simulate a large training job on NODES x GPUS_PER_NODE GPUs for HOURS of "
                    "simulated time: step "
        "and section timings, GPU samples, kernel-log Xids, process exits, flight-recorder dumps "
        "of hangs, benign "
        "noise and faults at the mix of the Llama 3 interruption table. Writes the store through "
        "the segment sink "
        "and the ground truth to a labels file kept outside the store. Deterministic for a seed.")
    add_store_arg(sim)
    sim.add_argument("--nodes", type=int, default=16)
    sim.add_argument("--gpus-per-node", type=int, default=8)
    sim.add_argument("--hours", type=float, default=24.0)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--labels", help="labels file (JSON lines; default: <store>.labels.jsonl, "
                                      "beside the store)")
    sim.add_argument("--step-seconds", type=float, default=6.0,
                     help="mean training step time: sets the step-row volume (default %(default)s)")
    sim.add_argument("--sample-seconds", type=float, default=10.0,
                     help="GPU sampling interval of the node agents (default %(default)s)")
    sim.add_argument("--faults-per-day", type=float, default=24.0,
                     help="interruptions per simulated day, whole cluster (default %(default)s)")
    sim.add_argument("--stragglers-per-day", type=float, default=4.0)
    sim.add_argument("--benign-per-day", type=float, default=40.0)
    sim.add_argument("--kinds", default="",
                     help="comma-separated fault kinds to inject in this order, cycling, instead "
                          "of the Llama 3 mix "
                     "(see docs/simulator.md)")
    sim.add_argument("--numerics-every", type=int, default=0,
                     help="the in-job numerics probe: a parameter digest of every rank every N "
                          "steps (0: off; the sdc_param_flip kind needs it)")
    sim.add_argument("--pp", type=int, default=None, help="pipeline stages (default: 4, 2 or 1 by "
                                                          "node count)")
    sim.add_argument("--job", default=None, help="job id (default: pretrain-<seed>)")
    sim.add_argument("--start", default="2026-01-05T00:00:00+00:00", help="simulated start time "
                                                                          "(ISO, with zone)")
    sim.add_argument("--json", action="store_true", help="print the summary as JSON")
    sim.set_defaults(func=run_simulate)

    ev = subparsers.add_parser(
        "eval", help="score incidents and decisions against a labels file",
        description="Match the store's incidents (or, when it has none, what the attribution "
                    "engine finds now) to "
        "the labelled faults and report precision/recall/F1 per class and for culprit-node "
        "localisation, cause "
        "accuracy, wrong automatic failovers, escalation rate, the share handled without a human, "
        "and detection "
        "latency in simulated time.")
    add_store_arg(ev)
    ev.add_argument("--labels", required=True, help="labels file written by `faultlens simulate`")
    ev.add_argument("--job", default=None, help="only this job")
    ev.add_argument("--rerun", action="store_true", help="run the engine even if the store has "
                                                         "incidents")
    ev.add_argument("--replay", action="store_true",
                    help="measure detection latency by replaying each fault's telemetry through "
                         "the live engine "
                    "on the simulated clock (slower: a few seconds per fault)")
    ev.add_argument("--json", action="store_true", help="JSON output")
    ev.set_defaults(func=run_eval)


def run_simulate(args: argparse.Namespace) -> int:
    from faultlens.controller.lab.simulate import SimConfig, simulate

    try:
        start = dt.datetime.fromisoformat(args.start)
    except ValueError:
        raise CliError(f"--start: expected an ISO-8601 timestamp, got {args.start!r}") from None
    if start.tzinfo is None:
        raise CliError(f"--start: expected a time zone (e.g. +00:00), got {args.start!r}")
    store = args.store
    if "://" not in store and os.path.isdir(store) and any(Path(store).iterdir()):
        raise CliError(
            f"store {store!r} already holds data: simulate into a new or empty directory"
        )
    cfg = SimConfig(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        hours=args.hours,
        seed=args.seed,
        start=start,
        job_id=args.job,
        pp_size=args.pp,
        step_seconds=args.step_seconds,
        sample_seconds=args.sample_seconds,
        faults_per_day=args.faults_per_day,
        stragglers_per_day=args.stragglers_per_day,
        benign_per_day=args.benign_per_day,
        fault_sequence=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
        numerics_every=args.numerics_every,
    )
    from faultlens.controller.cli.progress import progress

    with progress(f"simulating {cfg.hours:g} h on {cfg.nodes} nodes", total=1.0) as task:
        result = simulate(
            cfg, store, args.labels, progress=lambda share: task.update(completed=share)
        )
    summary = result.summary()
    if args.json:
        json.dump(summary, sys.stdout, indent=1, default=json_default)
        sys.stdout.write("\n")
        return 0
    print(f"simulated {cfg.hours:g} h of {cfg.job} on {cfg.nodes} nodes x {cfg.gpus_per_node} GPUs "
          f"({result.attempts} attempts) in {result.elapsed_s:.1f} s")
    emit(
        [{"table": k, "rows": v} for k, v in summary["rows"].items()], "table", title="rows written"
    )
    emit([{"fault kind": k, "count": v} for k, v in summary["faults_by_kind"].items()], "table",
         title=f"faults ({summary['faults']})")
    emit([{"benign noise": k, "count": v} for k, v in summary["benign_by_kind"].items()], "table")
    print(f"store: {result.store}\nlabels: {result.labels_path}")
    return 0


def _replay_progress(detection) -> None:
    when = detection.detected_at.isoformat() if detection.detected_at else "not detected"
    print(f"replayed {detection.fault_id}: {when} ({detection.polls} polls)", file=sys.stderr)


def run_eval(args: argparse.Namespace) -> int:
    from faultlens.attribution.reading.store import Store
    from faultlens.controller.lab.evaluate import (
        evaluate,
        load_decider,
        load_incidents,
        report_rows,
    )
    from faultlens.controller.lab.fault_labels import read_labels

    labels = read_labels(args.labels)
    store = Store(args.store)
    from faultlens.controller.cli.progress import progress

    with store:
        with progress("reading incidents (or attributing the store when it has none)"):
            incidents, origin = load_incidents(store, job=args.job, rerun=args.rerun)
        decide, decisions_source = load_decider(store, incidents)
        if args.job:
            labels = [label for label in labels if label.job_id in (None, args.job)]
        replay = None
        if args.replay:
            from faultlens.controller.lab.evaluate import stands_for
            from faultlens.controller.lab.replay import replay_faults

            with progress(
                "replaying each fault through the live engine", total=len(labels)
            ) as task:

                def step(detection) -> None:
                    task.advance()
                    if not args.json:
                        _replay_progress(detection)

                detections = replay_faults(store, labels, stands_for, progress=step)
            replay = {fault_id: d.detected_at for fault_id, d in detections.items()}
        with progress("scoring"):
            report = evaluate(
                labels, incidents, decide=decide, decisions_source=decisions_source, replay=replay
            )
    data = report.to_json()
    data["incidents_from"] = origin
    if args.json:
        json.dump(data, sys.stdout, indent=1, default=json_default)
        sys.stdout.write("\n")
        return 0
    print(f"{data['faults']} labelled faults, {data['incidents']} incidents ({origin}); decisions "
          "from "
          f"{decisions_source}")
    for title, rows in report_rows(report).items():
        emit(rows, "table", title=title)
    if data["missed"]:
        print("missed: " + ", ".join(data["missed"]))
    return 0
