"""The demo's fault schedule under faultlens vs under plain `torchrun --max-restarts 3`, in one run.

    PYTHONPATH=. python -m bench.bench_demo_vs_torchrun [--steps 300] [--timeout 60] [--max-restarts
    3]

Both sides run the same job (controller/demo/train.py: DDP over gloo on the CPU, 2 simulated nodes x
2 ranks on loopback, local checkpoints every 5 steps, durable every 10) with the same faults, in the
demo's order:

- faultlens: the reference supervisor (controller/supervisor/run.py) with the demo's schedule
  (controller/demo/schedule.py) and 4 spare nodes, exactly as `faultlens demo` runs it: each
  hardware-side fault is attributed, the node excluded, a spare taken and the job resumed from the
  chosen checkpoint; the software bug is escalated to a human.
- plain torchrun: two agents (`python -m torch.distributed.run --nnodes 2 --nproc-per-node 2
  --node-rank i --max-restarts 3`, static rendezvous on 127.0.0.1), no faultlens supervisor; the
  script resumes by itself from the newest complete checkpoint (FAULTLENS_RESUME_LATEST=1) and a
  restart comes back on the same two nodes. So: the straggler (rank 3's hot GPU on node-1) is never
  noticed and slows every later step; the hang waits for gloo's collective timeout (--timeout, the
  demo's 60 s); the SIGKILL restarts; the lost GPU (node-1) is still lost on every restart, so its
  local rank 0 dies again at once until the restarts are spent. The faults fire at the same training
  steps as on the faultlens side where the schedule allows: the straggler at step 6, the hang at the
  step where it hit under faultlens, the SIGKILL and the Xid 79 6 steps after the step the attempt
  resumed from (the demo's rule). With the restarts spent on the lost GPU, plain torchrun never
  reaches the software bug; a second plain run (--no-bug-run skips it) gives the bug alone, at the
  step where it hit under faultlens, repeating on every restart as a deterministic bug does, to
  measure its restarts and the time it takes to stop.

ETTR (reference/failures.md 2(b)): productive step time / wall time, productive = the steps in the
final model's lineage x their measured duration (median over the ranks of the steps table's
duration_s; checkpoint writes excluded). The lineage ends at the last step when the job finished,
else at the newest complete checkpoint every rank can restore (work after it is lost), and is walked
back through the attempts (each attempt resumed from the step before its first). Lost steps:
completed steps (any rank recorded them) not in that lineage. ETTR so defined counts a step a
straggler slowed at its slowed duration, so the straggler's cost shows instead in
goodput_at_healthy_step = kept steps x the healthy step time / wall time (healthy step time: the
median duration of both sides' steps before the first fault, measured in this run) and in
kept_steps_per_min.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import emit, machine
from faultlens import environment
from faultlens.controller.demo.config import NNODES, NPROC

ROOT = Path(__file__).resolve().parents[1]
WORLD = NNODES * NPROC


def say(text: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# measurements


@dataclass
class AttemptSteps:
    attempt: int
    first: int | None = None
    last: int | None = None
    durations: dict[int, float] = field(default_factory=dict)


def read_steps(store: str, job_id: str) -> dict[int, AttemptSteps]:
    """attempt -> its completed train steps and their duration (median over the ranks that recorded
    them).
    """
    from faultlens.attribution.reading.store import Store

    with Store(store, jobs=[job_id]) as reader:
        rows = reader.query("SELECT attempt, step, median(duration_s) AS duration_s FROM steps "
                            "WHERE phase = 'train' AND job_id = ? AND duration_s IS NOT NULL "
                            "GROUP BY attempt, step ORDER BY attempt, step", [job_id]).to_pylist()
    attempts: dict[int, AttemptSteps] = {}
    for row in rows:
        record = attempts.setdefault(int(row["attempt"]), AttemptSteps(int(row["attempt"])))
        record.durations[int(row["step"])] = float(row["duration_s"])
    for record in attempts.values():
        record.first, record.last = min(record.durations), max(record.durations)
    return attempts


def lineage(attempts: dict[int, AttemptSteps], final_step: int | None) -> list[tuple[int, int]]:
    """(attempt, step) of every step in the final model: the latest attempt that computed
    `final_step` owns [its first step, final_step]; the step before its first was restored from an
    earlier attempt, and so on."""
    kept: list[tuple[int, int]] = []
    end = final_step if final_step is not None else -1
    for number in sorted(attempts, reverse=True):
        record = attempts[number]
        if end < 0:
            break
        if record.first is None or record.last is None or not record.first <= end <= record.last:
            continue
        kept.extend(
            (number, step) for step in range(record.first, end + 1) if step in record.durations
        )
        end = record.first - 1
    return sorted(kept)


def ettr_figures(
    attempts: dict[int, AttemptSteps], final_step: int | None, wall_s: float
) -> dict[str, Any]:
    kept = lineage(attempts, final_step)
    productive = sum(attempts[a].durations[s] for a, s in kept)
    computed = sum(len(r.durations) for r in attempts.values())
    durations = [attempts[a].durations[s] for a, s in kept]
    return {
        "final_step": final_step,
        "kept_steps": len(kept),
        "computed_steps": computed,
        "lost_steps": computed - len(kept),
        "productive_s": round(productive, 2),
        "ettr": round(productive / wall_s, 4) if wall_s > 0 else None,
        "median_kept_step_s": round(statistics.median(durations), 3) if durations else None,
        "kept_steps_per_min": round(60.0 * len(kept) / wall_s, 1) if wall_s > 0 else None,
    }


def pre_fault_durations(attempts: dict[int, AttemptSteps], first_fault_step: int) -> list[float]:
    """Durations of the first attempt's steps before the first fault acted (the job's healthy step
    time).
    """
    first = attempts.get(0)
    return (
        []
        if first is None
        else [d for step, d in first.durations.items() if step < first_fault_step]
    )


def add_goodput(side: dict[str, Any], healthy_step_s: float | None) -> None:
    """Kept steps at the healthy step time / wall time: unlike ETTR as defined (measured durations),
    a step a straggler slowed counts only for what it should have cost (reference 2(b): waste = 1 -
    1/S)."""
    wall = side["wall_s"]
    side["goodput_at_healthy_step"] = (round(side["kept_steps"] * healthy_step_s / wall, 4)
                                       if healthy_step_s and wall > 0 else None)


def bug_markers(paths: Sequence[Path]) -> list[tuple[int, float]]:
    """(attempt, epoch seconds) of every software_bug marker the training script wrote."""
    found = []
    for directory in paths:
        for marker in directory.glob("software_bug-a*-r*"):
            try:
                attempt = int(marker.name.split("-")[1][1:])
                found.append((attempt, float(marker.read_text())))
            except (ValueError, OSError):
                continue
    return sorted(found, key=lambda item: item[1])


def bug_figures(
    markers: list[tuple[int, float]], attempts_started: int, stopped_epoch: float
) -> dict[str, Any]:
    if not markers:
        return {
            "software_bug_reached": False,
            "software_bug_occurrences": 0,
            "software_bug_restarts": None,
            "software_bug_to_stop_s": None,
        }
    first_attempt, first_time = markers[0]
    return {"software_bug_reached": True,
            "software_bug_occurrences": len({attempt for attempt, _ in markers}),
            "software_bug_restarts": attempts_started - 1 - first_attempt,
            "software_bug_to_stop_s": round(stopped_epoch - first_time, 1)}


# ------------------------------------------------------------------------------------------------
# faultlens side


def run_faultlens(workdir: Path, steps: int, timeout_s: float) -> dict[str, Any]:
    from faultlens.controller.demo.config import demo_run_config
    from faultlens.controller.demo.faults import Fault, FaultKind
    from faultlens.controller.demo.schedule import DEMO_FAULTS, demo_fault
    from faultlens.controller.supervisor.run import Supervisor

    store = str(workdir / "store")
    # exactly as `faultlens demo` runs it (thresholds, declared length, hang grace), with the
    # bench's own timeout
    config = demo_run_config(steps=steps, store=store, workdir=workdir / "run",
                             train_args=("--timeout", str(timeout_s)),
                             job_id=f"bench-faultlens-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}",
                             max_attempts=len(DEMO_FAULTS) + 1)
    fault_steps: dict[str, int] = {}

    def faults(attempt: int, nodes: Sequence[str], start_step: int):
        chosen = demo_fault(attempt, nodes, start_step, NPROC)
        fault = Fault.from_json(environment.DEMO_FAULT.raw(chosen.env))
        if fault.kind is not FaultKind.NONE:
            fault_steps.setdefault(fault.kind.value, fault.step)
        return chosen

    supervisor = Supervisor(config, faults=faults, on_event=lambda text: say(f"faultlens: {text}"))
    started = time.monotonic()
    try:
        result = supervisor.run()
    finally:
        stopped_epoch, wall_s = time.time(), time.monotonic() - started
        supervisor.close()
    if result.outcome.value == "completed":
        final_step = result.attempts[-1].last_step
    else:
        choice = supervisor.catalog.choose(result.excluded, world_size=WORLD)
        final_step = None if choice is None else choice.step
    attempts = read_steps(store, config.job_id)
    markers = bug_markers([workdir / "run" / f"attempt-{r.attempt}" for r in result.attempts])
    per_attempt = []
    for record in result.attempts:
        steps_of = attempts.get(record.attempt)
        per_attempt.append(
            {
                "attempt": record.attempt,
                "nodes": list(record.nodes),
                "fault": record.fault,
                "first_step": steps_of.first if steps_of else None,
                "last_step": steps_of.last if steps_of else None,
                "incident": None
                if record.incident is None
                else f"{record.incident.incident_class.value}/{record.incident.cause.value}",
                "decision": None if record.decision is None else record.decision.action.value,
                "excluded": [] if record.decision is None else list(record.decision.exclude_nodes),
                "seconds": round(
                    ((record.ended or record.started) - record.started).total_seconds(), 1
                ),
            }
        )
    escalated = result.outcome.value == "escalated"
    return {
        "wall_s": round(wall_s, 1),
        "outcome": result.outcome.value,
        "ended_by": "human escalation" if escalated else (
            "finished" if result.outcome.value == "completed" else result.outcome.value),
        "restarts": len(result.attempts) - 1,
        "excluded_nodes": result.excluded,
        **ettr_figures(attempts, final_step, wall_s),
        **bug_figures(markers, len(result.attempts), stopped_epoch),
        "fault_steps": fault_steps,
        "_pre_fault": pre_fault_durations(attempts, min(fault_steps.values(), default=0)),
        "attempts": per_attempt,
    }


# ------------------------------------------------------------------------------------------------
# plain torchrun


def plain_schedule(max_restarts: int, hang_step: int) -> list[list[dict[str, Any]]]:
    """FAULTLENS_DEMO_FAULTS for plain torchrun: the demo's faults (controller/demo/schedule.py) in
    order, on the same two nodes. The straggler (a hot GPU) and the lost GPU stay with their node on
    every restart; each fault that ends an attempt is followed by the next one in the next restart,
    at the demo's offset from the step it resumes at; the hang, in the straggler's attempt, at
    `hang_step`."""
    from dataclasses import replace

    from faultlens.controller.demo.faults import Fault, FaultKind
    from faultlens.controller.demo.schedule import DEMO_FAULTS, demo_fault

    nodes = [f"node-{i}" for i in range(NNODES)]
    demo = [Fault.from_json(environment.DEMO_FAULT.raw(demo_fault(i, nodes, 0, NPROC).env))
            for i in range(len(DEMO_FAULTS))]  # start step 0: `step` is the demo's offset
    hot = next(f for f in demo if f.kind is FaultKind.STRAGGLER)
    still_hot = replace(hot, step=0, relative=True)
    ending = [replace(f, step=hang_step) if f.kind is FaultKind.HANG else replace(f, relative=True)
              for f in demo if f.kind is not FaultKind.STRAGGLER]
    schedule: list[list[dict[str, Any]]] = []
    lost: Fault | None = None
    for restart in range(max_restarts + 1):
        faults = [hot if restart == 0 else still_hot]
        if lost is not None:  # the GPU is still off the bus: its rank dies again at the first step
            faults.append(replace(lost, step=0))
        elif restart < len(ending):
            faults.append(ending[restart])
            lost = ending[restart] if ending[restart].kind is FaultKind.GPU_LOST else None
        schedule.append([f.to_dict() for f in faults])
    return schedule


def bug_schedule(max_restarts: int, bug_step: int) -> list[list[dict[str, Any]]]:
    """The software bug alone: the same exception at the same step on every restart (a deterministic
    bug).
    """
    from faultlens.controller.demo.faults import Fault, FaultKind

    return [[Fault(FaultKind.SOFTWARE, step=bug_step).to_dict()] for _ in range(max_restarts + 1)]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker_errors(log_dirs: Sequence[Path], attempt: int) -> list[str]:
    """The distinct first lines of the error.json files torchrun's workers wrote in this attempt,
    oldest first (what a user reads: the survivors' gloo errors usually come before the culprit's
    own)."""
    found = []
    for log_dir in log_dirs:
        for path in log_dir.glob(f"*/attempt_{attempt}/*/error.json"):
            try:
                message = json.loads(path.read_text()).get("message")
                stamp = float((message.get("extraInfo") or {}).get("timestamp") or 0)
                found.append((stamp, str(message.get("message")).strip().splitlines()[0][:120]))
            except (OSError, ValueError, AttributeError, IndexError):
                continue
    lines: list[str] = []
    for _, line in sorted(found):
        if line not in lines:
            lines.append(line)
    return lines


def _attempt_started(logs: Path, attempt: int) -> float | None:
    """When torchrun started an attempt: the earliest creation of its attempt_N log directory on any
    node.
    """
    # rank dirs made at start
    times = [path.stat().st_mtime for path in logs.glob(f"*/*/attempt_{attempt}")]
    return min(times) if times else None


def run_plain(
    workdir: Path,
    steps: int,
    timeout_s: float,
    max_restarts: int,
    schedule: list,
    name: str,
    deadline_s: float,
) -> dict[str, Any]:
    """Two torchrun agents (one per simulated node) with --max-restarts, no supervisor, until both
    exit.
    """
    from faultlens.controller.checkpoints.catalog import CheckpointCatalog
    from faultlens.controller.checkpoints.tiers import Tier, TierKind

    store = str(workdir / "store")
    job_id = f"bench-{name}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
    demo_dir = workdir / "demo"
    demo_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((environment.PREFIX, "TORCHELASTIC_"))
    }
    base_env.update(
        PYTHONUNBUFFERED="1",
        FAULTLENS_STORE=store,
        FAULTLENS_JOB_ID=job_id,
        FAULTLENS_CKPT_DURABLE=str(workdir / "durable"),
        FAULTLENS_DEMO_DIR=str(demo_dir),
        FAULTLENS_RESUME_LATEST="1",
        FAULTLENS_DEMO_FAULTS=json.dumps(schedule),
    )
    processes: list[tuple[str, subprocess.Popen]] = []
    started = time.monotonic()
    for node_rank in range(NNODES):
        node = f"node-{node_rank}"
        local = workdir / "nodes" / node / "ckpt"
        local.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(NNODES),
            "--nproc-per-node",
            str(NPROC),
            "--node-rank",
            str(node_rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--max-restarts",
            str(max_restarts),
            "--log-dir",
            str(workdir / "logs" / node),
            "-m",
            "faultlens.controller.demo.train",
            "--steps",
            str(steps),
            "--timeout",
            str(timeout_s),
        ]
        env = {**base_env, "FAULTLENS_NODE": node, "FAULTLENS_CKPT_LOCAL": str(local)}
        with (
            open(workdir / f"torchrun-{node}.stderr", "wb") as err,
            open(workdir / f"torchrun-{node}.stdout", "wb") as out,
        ):
            processes.append(
                (
                    node,
                    subprocess.Popen(
                        command,
                        env=env,
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    ),
                )
            )
    say(
        f"{name}: plain torchrun, 2 agents, --max-restarts {max_restarts}; faults per restart: "
        + "; ".join(
            f"{i}: "
            + ", ".join(f"{f['kind']}@{'+' if f['relative'] else ''}{f['step']}" for f in item)
            for i, item in enumerate(schedule)
        )
    )
    timed_out = False
    exit_codes: dict[str, int | None] = {}
    for node, process in processes:
        try:
            exit_codes[node] = process.wait(
                timeout=max(1.0, deadline_s - (time.monotonic() - started))
            )
        except subprocess.TimeoutExpired:
            timed_out = True
    stopped_epoch, wall_s = time.time(), time.monotonic() - started
    for node, process in processes:  # workers left behind, or agents past the deadline
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        exit_codes[node] = process.wait()
    attempts_started = max(
        (len(list((workdir / "logs" / node).glob("*/attempt_*"))) for node, _ in processes),
        default=0,
    )
    finished = not timed_out and all(code == 0 for code in exit_codes.values())
    attempts = read_steps(store, job_id)
    if finished:
        final_step = max((r.last for r in attempts.values() if r.last is not None), default=None)
    # what a restart would resume from: the newest checkpoint complete for every rank, no node
    # excluded
    else:
        tiers = [
            Tier(TierKind.LOCAL, str(workdir / "nodes" / node / "ckpt"), node=node)
            for node, _ in processes
        ]
        choice = CheckpointCatalog(
            [*tiers, Tier(TierKind.DURABLE, str(workdir / "durable"))]
        ).choose(world_size=WORLD)
        final_step = None if choice is None else choice.step
    starts = [_attempt_started(workdir / "logs", attempt) for attempt in range(attempts_started)]
    ends = [*starts[1:], stopped_epoch]
    per_attempt = []
    for attempt in range(attempts_started):
        steps_of = attempts.get(attempt)
        begin, end = starts[attempt], ends[attempt]
        per_attempt.append(
            {
                "attempt": attempt,
                "nodes": [node for node, _ in processes],
                "seconds": round(end - begin, 1) if begin is not None and end is not None else None,
                "faults": [
                    f"{f['kind']}@{'+' if f['relative'] else ''}{f['step']}"
                    for f in (schedule[attempt] if attempt < len(schedule) else [])
                ],
                "first_step": steps_of.first if steps_of else None,
                "last_step": steps_of.last if steps_of else None,
                "worker_errors": _worker_errors(
                    [workdir / "logs" / node for node, _ in processes], attempt
                ),
            }
        )
    return {
        "wall_s": round(wall_s, 1),
        "outcome": "timed_out" if timed_out else ("completed" if finished else "failed"),
        "ended_by": "bench deadline"
        if timed_out
        else (
            "finished"
            if finished
            else ("restarts exhausted" if attempts_started == max_restarts + 1 else "failed")
        ),
        "exit_codes": exit_codes,
        "restarts": max(0, attempts_started - 1),
        "excluded_nodes": [],
        **ettr_figures(attempts, final_step, wall_s),
        **bug_figures(bug_markers([demo_dir]), attempts_started, stopped_epoch),
        "_pre_fault": pre_fault_durations(
            attempts, min((f["step"] for f in schedule[0]), default=0)
        ),
        "attempts": per_attempt,
    }


# ------------------------------------------------------------------------------------------------
# main


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="step budget of the job (default "
                                                               "%(default)s)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="gloo collective timeout in seconds, both sides (default %(default)s, "
                             "the demo's)")
    parser.add_argument("--max-restarts", type=int, default=3, help="plain torchrun's "
                                                                    "--max-restarts")
    parser.add_argument("--workdir", default=str(ROOT / "bench" / "out" / "demo_vs_torchrun"))
    parser.add_argument("--no-bug-run", action="store_true", help="skip the plain run of the "
                                                                  "software bug alone")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    # `-m faultlens.controller.demo.train` resolves through PYTHONPATH, from any directory
    os.chdir(workdir)
    started = time.monotonic()

    say("faultlens side: the demo's schedule under the reference supervisor")
    faultlens = run_faultlens(workdir / "faultlens", args.steps, args.timeout)
    say(f"faultlens side: {faultlens['outcome']} after {faultlens['wall_s']} s")

    hang_step = faultlens["fault_steps"].get("hang", 12)
    bug_step = faultlens["fault_steps"].get("software", 26)
    say("plain side: the same faults under torchrun --max-restarts")
    plain = run_plain(workdir / "torchrun", args.steps, args.timeout, args.max_restarts,
                      plain_schedule(args.max_restarts, hang_step), "torchrun", deadline_s=420.0)
    say(f"plain side: {plain['ended_by']} after {plain['wall_s']} s")
    bug_run = None
    if not args.no_bug_run:
        say("plain side: the software bug alone under torchrun --max-restarts")
        bug_run = run_plain(
            workdir / "torchrun-bug",
            args.steps,
            args.timeout,
            args.max_restarts,
            bug_schedule(args.max_restarts, bug_step),
            "torchrun-bug",
            deadline_s=240.0,
        )
        say(f"plain bug run: {bug_run['ended_by']} after {bug_run['wall_s']} s")

    pre_fault = faultlens.pop("_pre_fault") + plain.pop("_pre_fault")
    healthy_step_s = statistics.median(pre_fault) if pre_fault else None
    for side in (faultlens, plain, bug_run):
        if side is not None:
            side.pop("_pre_fault", None)
            add_goodput(side, healthy_step_s)
    bug_source = plain if plain["software_bug_reached"] or bug_run is None else bug_run
    result = {
        "machine": machine(),
        "job": f"faultlens.controller.demo.train, DDP/gloo CPU, {NNODES} nodes x {NPROC} ranks on "
        "loopback, --steps "
        f"{args.steps}, checkpoints local every 5 / durable every 10 steps",
        "gloo_timeout_s": args.timeout,
        "max_restarts": args.max_restarts,
        "healthy_step_s": None if healthy_step_s is None else round(healthy_step_s, 4),
        "healthy_step_samples": len(pre_fault),
        "faultlens": faultlens,
        "torchrun": plain,
        "torchrun_software_bug_alone": bug_run,
        "ratios": {
            "ettr_faultlens_over_torchrun": _ratio(faultlens["ettr"], plain["ettr"]),
            "goodput_faultlens_over_torchrun": _ratio(
                faultlens["goodput_at_healthy_step"], plain["goodput_at_healthy_step"]
            ),
            "kept_steps_per_min_faultlens_over_torchrun": _ratio(
                faultlens["kept_steps_per_min"], plain["kept_steps_per_min"]
            ),
            "kept_steps_faultlens_over_torchrun": _ratio(
                faultlens["kept_steps"], plain["kept_steps"]
            ),
            "lost_steps_torchrun_over_faultlens": _ratio(
                plain["lost_steps"], faultlens["lost_steps"]
            ),
            "wall_torchrun_over_faultlens": _ratio(plain["wall_s"], faultlens["wall_s"]),
            "software_bug_restarts": {
                "faultlens": faultlens["software_bug_restarts"],
                "torchrun": bug_source["software_bug_restarts"],
            },
            "software_bug_to_stop_s_torchrun_over_faultlens": _ratio(
                bug_source["software_bug_to_stop_s"], faultlens["software_bug_to_stop_s"]
            ),
        },
        "bench_seconds": round(time.monotonic() - started, 1),
    }
    emit("demo_vs_torchrun", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
