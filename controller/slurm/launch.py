"""Running an instrumented job the Slurm way: `faultlens slurm run` in the batch script starts one
`faultlens slurm node` task per node with srun (--kill-on-bad-exit), and each starts torchrun for
its node; faultlens' identity comes from Slurm's:

    job id   SLURM_JOB_NAME (stable across requeues; the Slurm job number is not the faultlens id)
    attempt  SLURM_RESTART_COUNT (0 on the first run, +1 per requeue)
    node     SLURMD_NODENAME

The restore point a failover chose (controller/slurm/restore.py) is put in the training
environment. On each node the task runs the node agent (`faultlens collect`, when sources are
given; its NVML source may replay a recorded GPU timeline per node, `{node}` in the path) for the
job's life; the ranks get the job's store ($FAULTLENS_STORE, for their step timer) and the
attempt's flight-recorder trigger and dump directory (controller/slurm/dumps.py); when torchrun
fails the task imports torchrun's report and log tree into the store (process_events) before it
exits, so the attribution service sees the failure. The task also reads its ranks' heartbeat
records into the store for the job's life (controller/slurm/beats.py), and the batch side reads
srun's reports of the node tasks' ends and of the step's teardown into lifecycle rows
(controller/slurm/srun.py): the evidence `faultlens run` has of its own agents.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from faultlens import environment
from faultlens.controller.slurm.beats import beats_dir, start_reader
from faultlens.controller.slurm.commands import parse_record
from faultlens.controller.slurm.dumps import attempt_dir, dump_dir, trigger_path
from faultlens.controller.slurm.restore import read_restore
from faultlens.errors import FaultlensError


class SlurmLaunchError(RuntimeError, FaultlensError):
    """Not inside a Slurm job, or a setting is missing."""


@dataclass(frozen=True)
class SlurmIdentity:
    job_id: str
    attempt: int
    node: str | None
    slurm_job: str
    nodelist: str
    nnodes: int
    node_rank: int | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlurmIdentity:
        missing = [
            k for k in ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST") if not env.get(k)
        ]
        if missing:
            raise SlurmLaunchError(f"not inside a Slurm job: {', '.join(missing)} unset")
        node_rank = env.get("SLURM_NODEID")
        return cls(
            job_id=environment.JOB_ID.raw(env) or env["SLURM_JOB_NAME"],
            attempt=int(env.get("SLURM_RESTART_COUNT") or 0),
            node=env.get("SLURMD_NODENAME"),
            slurm_job=env["SLURM_JOB_ID"],
            nodelist=env["SLURM_JOB_NODELIST"],
            nnodes=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1),
            node_rank=int(node_rank) if node_rank and node_rank.isdigit() else None,
        )

    def env_vars(self) -> dict[str, str]:
        env = {environment.JOB_ID.name: self.job_id, environment.ATTEMPT.name: str(self.attempt)}
        if self.node:
            env[environment.NODE.name] = self.node
        return env


def head_node(nodelist: str) -> str:
    """The address of the job's first node (its NodeAddr: a node name need not resolve)."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    names = out.stdout.split()
    if out.returncode != 0 or not names:
        raise SlurmLaunchError(f"scontrol show hostnames {nodelist}: {out.stderr.strip()}")
    node = subprocess.run(
        ["scontrol", "show", "node", "-o", names[0]],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    record = parse_record(node.stdout) if node.returncode == 0 else {}
    return record.get("NodeAddr") or names[0]


def run_job(
    argv: Sequence[str],
    *,
    nproc_per_node: int,
    state_dir: str | None,
    store: str | None,
    rdzv_port: int | None,
    work_dir: str,
    agent_sources: str | None,
    agent_nvml_timeline: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """The batch script's side: one node task per node with srun; returns srun's status."""
    env = dict(os.environ if env is None else env)
    ident = SlurmIdentity.from_env(env)
    extra = ident.env_vars()
    if state_dir:
        extra.update(read_restore(state_dir, ident.job_id))
    head = head_node(ident.nodelist)
    if rdzv_port is None:
        rdzv_port = 20000 + int(ident.slurm_job) % 10000 if ident.slurm_job.isdigit() else 29500
    node_cmd = [
        sys.executable,
        "-m",
        "faultlens.controller.cli.main",
        "slurm",
        "node",
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-endpoint",
        f"{head}:{rdzv_port}",
        "--work-dir",
        work_dir,
    ]
    if store:
        node_cmd += ["--store", store]
    if agent_sources:
        node_cmd += ["--agent-sources", agent_sources]
    if agent_nvml_timeline:
        node_cmd += ["--agent-nvml-timeline", agent_nvml_timeline]
    srun = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={ident.nnodes}",
        "--ntasks-per-node=1",
        f"--ntasks={ident.nnodes}",
        "--export=ALL",
        *node_cmd,
        "--",
        *argv,
    ]
    print(
        f"faultlens slurm: job {ident.job_id} attempt {ident.attempt} (Slurm job "
        f"{ident.slurm_job}) on {ident.nodelist}"
        + (
            f", restore step {extra[environment.RESTORE_STEP.name]}"
            if environment.RESTORE_STEP.name in extra
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )
    return _run_srun(srun, {**env, **extra}, store, ident)


def _run_srun(srun: list[str], env: dict[str, str], store: str | None,
              ident: SlurmIdentity) -> int:
    """srun, its stderr passed on line by line and read for the node tasks' ends and the step's
    teardown (controller/slurm/srun.py: the supervisor's lifecycle rows in the job's store)."""
    from faultlens.controller.slurm.srun import SrunWatch, open_recorder

    proc = subprocess.Popen(srun, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
                            bufsize=1)
    assert proc.stderr is not None
    # opened while srun starts the node tasks (the store's imports are not on their way)
    watch = SrunWatch(open_recorder(store, ident.job_id), ident.attempt, proc.pid)
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        try:
            watch.line(line)
        except Exception as exc:  # srun's report matters more than its rows
            print(f"faultlens slurm: srun line not recorded: {exc}", file=sys.stderr, flush=True)
    return proc.wait()


def run_node(
    argv: Sequence[str],
    *,
    nproc_per_node: int,
    rdzv_endpoint: str,
    work_dir: str,
    store: str | None,
    agent_sources: str | None,
    agent_nvml_timeline: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """One node's side: the node agent for the job's life, torchrun for this node, its failure
    report into the store. SIGTERM (srun stopping the step) is passed to torchrun and the report
    still imported."""
    env = dict(os.environ if env is None else env)
    ident = SlurmIdentity.from_env(env)
    node = ident.node or os.uname().nodename
    logs = attempt_dir(work_dir, ident.job_id, ident.attempt) / node
    logs.mkdir(parents=True, exist_ok=True)
    dumps = dump_dir(work_dir, ident.job_id, ident.attempt)
    dumps.mkdir(parents=True, exist_ok=True)
    child_env = {
        **env,
        **ident.env_vars(),
        environment.NODE.name: node,
        # the ranks' flight-recorder trigger: `faultlens serve --fr-root` touches it when
        # progress stops (controller/slurm/dumps.py)
        environment.FR_DIR.name: str(dumps),
        environment.FR_TRIGGER.name: str(trigger_path(work_dir, ident.job_id, ident.attempt)),
    }
    if store:
        # the ranks' own instrumentation (the step timer) writes to the job's store
        child_env.setdefault(environment.STORE.name, store)
    beats = beats_dir(env, ident.slurm_job, ident.attempt, node) if store else None
    if beats is not None:
        child_env[environment.HEARTBEAT_DIR.name] = str(beats)
    reader = start_reader(beats, store, node, ident.job_id, ident.attempt)
    agent = None
    if agent_sources and store:
        timeline = []
        if agent_nvml_timeline:
            timeline = ["--nvml-timeline", agent_nvml_timeline.replace("{node}", node)]
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "faultlens.controller.cli.main",
                "collect",
                "--node",
                node,
                "--sources",
                agent_sources,
                "--store",
                store,
                *timeline,
            ],
            env=child_env,
            stdout=subprocess.DEVNULL,
            stderr=(logs / "agent.log").open("wb"),
            start_new_session=True,
        )
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(ident.nnodes),
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        rdzv_endpoint,
        "--rdzv-id",
        f"{ident.job_id}-{ident.slurm_job}-{ident.attempt}",
        "--log-dir",
        str(logs / "torchrun"),
        "--tee",
        "3",
        *argv,
    ]
    stderr_path = logs / "torchrun.stderr"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(torchrun, env=child_env, stderr=stderr)

        def forward(signum, _frame):
            proc.send_signal(signum)

        previous = signal.signal(signal.SIGTERM, forward)
        try:
            status = proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
    if reader is not None:
        reader.stop()
    if status != 0 and store:
        _import_failure(logs, stderr_path, store, ident, node)
    if agent is not None:
        agent.terminate()
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
    return status


def _import_failure(
    logs: Path, stderr_path: Path, store: str, ident: SlurmIdentity, node: str
) -> None:
    from faultlens.collectors.sources.process_events import EventContext, collect_paths
    from faultlens.collectors.sources.process_rules import load_process_rules
    from faultlens.collectors.store.sink import SegmentSink

    try:
        context = EventContext(node=node, job_id=ident.job_id, attempt=ident.attempt)
        paths = [str(p) for p in (logs / "torchrun", stderr_path) if p.exists()]
        result = collect_paths(paths, context, load_process_rules(None))
        if result.rows:
            table = result.table()
            sink = SegmentSink(store, flush_rows=max(table.num_rows, 1))
            try:
                sink.write("process_events", table)
                sink.flush()
            finally:
                sink.close()
        print(
            f"faultlens slurm: {node}: {len(result.rows)} process event(s) stored",
            file=sys.stderr,
            flush=True,
        )
    except Exception as exc:  # the job's exit status matters more than the report
        print(
            f"faultlens slurm: {node}: failure report not stored: {exc}",
            file=sys.stderr,
            flush=True,
        )
