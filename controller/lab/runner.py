"""Runs one campaign scenario: the user's script under `faultlens run` (a subprocess, as a user runs
it), the injector on PYTHONPATH, external faults and a CPU hog from here, the checkpoint tiers
listed at each restore plan the supervisor writes; then every process of the scenario is reaped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultlens.controller.lab.actions import CpuHog, ExternalActions, reap
from faultlens.controller.lab.plan import ENV_DIR, ENV_PLAN, EXTERNAL_KINDS, InjectionPlan
from faultlens.controller.lab.scenarios import Scenario
from faultlens.resources import import_root, shipped_path

SITE_DIR = Path(__file__).resolve().parent / "site"

#: a scenario's timeout_s is its allowance on a machine with up to this many runnable processes per
#: core (the scenario's own 4-6 on 2 cores included); above that it grows with the load seen while
#: the scenario runs, up to LOAD_SCALE_MAX times: a job on a shared machine runs at its CPU share
QUIET_LOAD_PER_CORE = 4.0
LOAD_SCALE_MAX = 6.0


def load_scale(load_per_core: float) -> float:
    """How many times its timeout a scenario may run at this mean load per core."""
    return min(LOAD_SCALE_MAX, max(1.0, load_per_core / QUIET_LOAD_PER_CORE))


def wait_scaled(proc: subprocess.Popen, timeout_s: float,
                load_per_core: Callable[[], float] | None = None,
                poll_s: float = 5.0) -> tuple[int | None, float]:
    """Wait for `proc` up to `timeout_s` scaled by the mean load per core sampled while it runs
    (load_scale). Returns its exit status (None: the allowance ran out) and the allowance."""
    sample = load_per_core or (lambda: os.getloadavg()[0] / (os.cpu_count() or 1))
    started, samples = time.monotonic(), []
    while True:
        samples.append(sample())
        allowed = timeout_s * load_scale(sum(samples) / len(samples))
        left = allowed - (time.monotonic() - started)
        if left <= 0:
            return None, round(allowed, 1)
        try:
            return proc.wait(timeout=min(poll_s, left)), round(allowed, 1)
        except subprocess.TimeoutExpired:
            continue


@dataclass
class RunArtifacts:
    """What one scenario run left behind, for the scoring."""

    scenario: str
    root: Path
    store: Path
    workdir: Path
    lab_dir: Path
    job_id: str
    rc: int | None = None
    timed_out: bool = False
    started: float = 0.0
    ended: float = 0.0
    # restore plan file -> tiers at that moment
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # the timeout it ran under (timeout_s scaled by the load: wait_scaled)
    allowed_s: float | None = None

    @property
    def wall_s(self) -> float:
        return self.ended - self.started


def list_checkpoints(workdir: Path) -> list[dict[str, Any]]:
    """Every checkpoint directory of the supervisor's tiers with a manifest: tier, node, step,
    ranks.
    """
    found = []
    tiers = [("local", p.parent.name, p) for p in sorted((workdir / "nodes").glob("*/ckpt"))]
    tiers.append(("durable", None, workdir / "durable"))
    for tier, node, root in tiers:
        for step_dir in sorted(root.glob("step-*")) if root.exists() else ():
            manifest = step_dir / "manifest.json"
            try:
                doc = json.loads(manifest.read_text())
            except (OSError, ValueError):
                continue  # no manifest (yet): not a complete checkpoint
            ranks = sorted(
                {int(f["rank"]) for f in doc.get("files") or () if f.get("rank") is not None}
            )
            found.append({"tier": tier, "node": node, "step": int(doc["step"]), "ranks": ranks,
                          "path": str(step_dir)})
    return found


class PlanWatcher:
    """Lists the checkpoint tiers the moment each restore-plan-N.json appears (before the next
    attempt writes).
    """

    def __init__(self, workdir: Path, artifacts: RunArtifacts, poll_s: float = 0.05) -> None:
        self.workdir = workdir
        self.artifacts = artifacts
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-plans", daemon=True)

    def start(self) -> PlanWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._scan()

    def _scan(self) -> None:
        for plan in sorted(self.workdir.glob("restore-plan-*.json")):
            if plan.name not in self.artifacts.snapshots:
                self.artifacts.snapshots[plan.name] = {
                    "ts": time.time(),
                    "checkpoints": list_checkpoints(self.workdir),
                }

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self._scan()
            self._stop.wait(self.poll_s)


def scenario_env(scenario: Scenario, lab_dir: Path, plan_path: Path) -> dict[str, str]:
    env = {**os.environ, **scenario.env}  # the job's own variables (a user's script's settings)
    path = [
        str(SITE_DIR),
        str(import_root()),
        *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []),
    ]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(path),
            ENV_DIR: str(lab_dir),
            ENV_PLAN: str(plan_path),
            "FAULTLENS_LAB_SUPERVISOR": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run_command(scenario: Scenario, art: RunArtifacts) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "faultlens.controller.cli.main",
        "run",
        "--store",
        str(art.store),
        "--nnodes",
        str(scenario.nodes),
        "--nproc-per-node",
        str(scenario.ranks),
        "--spares",
        str(scenario.spares),
        "--workdir",
        str(art.workdir),
        "--job",
        art.job_id,
        "--max-attempts",
        str(scenario.max_attempts),
    ]
    if scenario.thresholds:
        command += ["--thresholds", str(shipped_path(scenario.thresholds))]
    if scenario.assume_remaining_s is not None:
        command += ["--assume-remaining", f"{scenario.assume_remaining_s:g}"]
    if scenario.checkpoint_wait_s is not None:
        command += ["--checkpoint-wait", f"{scenario.checkpoint_wait_s:g}"]
    return [*command, "--", scenario.script, *scenario.args]


def run_scenario(scenario: Scenario, out_dir: Path, gpu_timelines: dict | None = None,
                 job_prefix: str = "camp") -> RunArtifacts:
    root = (out_dir / scenario.name).resolve()
    if root.exists():
        import shutil

        shutil.rmtree(root)
    lab_dir = root / "lab"
    lab_dir.mkdir(parents=True)
    art = RunArtifacts(scenario.name, root, root / "store", root / "run", lab_dir,
                       job_id=f"{job_prefix}-{scenario.name}-{int(time.time())}")
    plan = InjectionPlan(
        tuple(f for f in scenario.faults if f.kind != "cpu_hog"),
        dict(gpu_timelines or {}),
        scenario.ranks,
    )
    plan_path = lab_dir / "plan.json"
    plan_path.write_text(plan.to_json())
    hog = CpuHog(scenario.cpu_hog).start() if scenario.cpu_hog else None
    actions = ExternalActions(
        [f for f in scenario.faults if f.kind in EXTERNAL_KINDS], lab_dir
    ).start()
    watcher = PlanWatcher(art.workdir, art).start()
    art.started = time.time()
    with open(root / "supervisor.out", "wb") as out:
        proc = subprocess.Popen(
            run_command(scenario, art),
            env=scenario_env(scenario, lab_dir, plan_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(root),
        )
        try:
            rc, art.allowed_s = wait_scaled(proc, scenario.timeout_s)
            if rc is None:
                art.timed_out = True
                rc = _interrupt(proc)
            art.rc = rc
        except BaseException:  # Ctrl-C of the campaign: leave nothing of the scenario running
            _interrupt(proc)
            _cleanup(watcher, actions, hog, lab_dir)
            raise
    art.ended = time.time()
    _cleanup(watcher, actions, hog, lab_dir)
    art.errors.extend(actions.errors)
    errors = lab_dir / "injector-errors.log"
    if errors.exists():
        art.errors.extend(errors.read_text().splitlines())
    (root / "artifacts.json").write_text(
        json.dumps(
            {
                "scenario": art.scenario,
                "job_id": art.job_id,
                "rc": art.rc,
                "timed_out": art.timed_out,
                "allowed_s": art.allowed_s,
                "started": art.started,
                "ended": art.ended,
                "snapshots": art.snapshots,
                "errors": art.errors,
            },
            indent=1,
        )
    )
    return art


def _cleanup(
    watcher: PlanWatcher, actions: ExternalActions, hog: CpuHog | None, lab_dir: Path
) -> None:
    watcher.stop()
    actions.stop()
    if hog is not None:
        hog.stop()
    reap(lab_dir)


def _interrupt(proc: subprocess.Popen) -> int | None:
    """Ctrl-C the supervisor (it stops its agents on the way out), then kill its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=10)


def load_artifacts(root: Path) -> RunArtifacts:
    """A finished scenario run, from its directory (to score it again)."""
    doc = json.loads((root / "artifacts.json").read_text())
    art = RunArtifacts(
        doc["scenario"],
        root,
        root / "store",
        root / "run",
        root / "lab",
        doc["job_id"],
        rc=doc["rc"],
        timed_out=doc["timed_out"],
        allowed_s=doc.get("allowed_s"),
        started=doc["started"],
        ended=doc["ended"],
        snapshots=doc.get("snapshots") or {},
        errors=list(doc.get("errors") or []),
    )
    return art
