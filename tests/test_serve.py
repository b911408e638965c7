"""`faultlens serve` as shipped: the systemd unit's ExecStart and the compose service parse with the
real CLI; the unit's command, run for real against the real Slurm cluster and Alertmanager, is
killed -9 at random moments (five times here, twenty in bench/bench_slurm.py --serve-kills) while
it decides and delivers incidents of live Slurm jobs; Slurm's own job and node records then show
every decision applied exactly once (one requeue per failover, each culprit drained, each
escalated job held) and the store shows none lost."""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import yaml

from faultlens.attribution.decision import DeliveryStatus
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import build_parser
from faultlens.controller.delivery import DecisionLog
from tests.conftest import REPO_ROOT

UNIT = REPO_ROOT / "docs" / "deploy" / "systemd" / "faultlens-serve.service"


def unit_argv() -> list[str]:
    exec_start = re.search(r"^ExecStart=(.+)$", UNIT.read_text(), re.M).group(1)
    return shlex.split(exec_start)


def test_the_unit_and_the_compose_service_run_faultlens_serve():
    parser = build_parser()
    argv = unit_argv()
    assert os.path.basename(argv[0]) == "faultlens"
    args = parser.parse_args(argv[1:])
    assert args.command == "serve" and args.hooks and args.metrics_port
    assert re.search(r"^Restart=always$", UNIT.read_text(), re.M)
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["serve"]["command"]
    args = parser.parse_args(command[1:])
    assert args.command == "serve"
    assert (REPO_ROOT / args.hooks.removeprefix("/app/")).is_file()


def incident(n: int, job: str, node: str, cause: Cause, cls=IncidentClass.CRASH) -> Incident:
    t0 = dt.datetime.now(dt.UTC)
    return Incident(
        f"inc-serve-{job}-{n}",
        cls,
        cause,
        t0,
        t0,
        0.95,
        "xid-79",
        f"{cls.value} on {node}",
        job_id=job,
        attempt=0,
        culprit_nodes=(node,),
        culprit_ranks=(0,),
    )


KILLS = 5  # bench/bench_slurm.py --serve-kills 20 runs the same proof with twenty


def test_serve_killed_nine_at_random_moments_loses_no_decision_and_applies_none_twice(
    slurm, tmp_path, store_dir
):
    serve_killed_nine(slurm, tmp_path, store_dir, kills=KILLS, seed=35)


def serve_killed_nine(slurm, tmp_path, store_dir, *, kills: int, seed: int) -> dict:
    """Four live Slurm jobs, their incidents in the store, the unit's command killed -9 `kills`
    times at random moments, then left to finish; Slurm's records checked (AssertionError when a
    decision was lost or applied twice). Returns what was seen, for the bench."""
    # four live Slurm jobs, one node each
    script = tmp_path / "sleeper.sbatch"
    script.write_text("#!/bin/bash\nsleep 600\n")
    jobs = {}
    for name in ("fo-a", "fo-b", "esc-c", "esc-d"):
        job_id = slurm.sbatch(script, "-J", name, "-N", "1", "--requeue", "-o", "/dev/null")
        jobs[name] = job_id
    nodes = {}
    for name, job_id in jobs.items():
        nodes[name] = slurm.wait_job(job_id, {"RUNNING"})["NodeList"]
    # the incidents as the follower writes them: two GPU faults (failover), two software (escalate)
    incidents = [
        incident(1, "fo-a", nodes["fo-a"], Cause.GPU_HARDWARE),
        incident(2, "fo-b", nodes["fo-b"], Cause.GPU_HARDWARE),
        incident(3, "esc-c", nodes["esc-c"], Cause.SOFTWARE),
        incident(4, "esc-d", nodes["esc-d"], Cause.SOFTWARE),
    ]
    sink = SegmentSink(str(store_dir), flush_rows=100)
    sink.write("incidents", [i.to_row() for i in incidents])
    sink.close()
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(
        textwrap.dedent(f"""\
        format_version: 1
        hooks:
          - {{type: slurm, name: slurm, state_dir: {tmp_path}/state, slurm_conf: {slurm.conf}}}
          - {{type: alertmanager, name: page, url: "{slurm.alertmanager_url}"}}
        """)
    )
    from tests.slurm_cluster import free_ports

    # the unit's own command line, pointed at this store, hooks file and a free port
    argv = unit_argv()[1:]
    argv[argv.index("--hooks") + 1] = str(hooks)
    argv[argv.index("--metrics-port") + 1] = str(free_ports(1)[0])
    argv[argv.index("--metrics-addr") + 1] = "127.0.0.1"
    argv[argv.index("--interval") + 1] = "0.3"
    argv += ["--store", str(store_dir), "--catch-up", "0.5"]
    command = [sys.executable, "-m", "faultlens.controller.cli.main", *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SLURM_CONF": str(slurm.conf)}
    rng = random.Random(seed)
    log = (tmp_path / "serve.log").open("ab")
    t0 = time.monotonic()
    for _ in range(kills):
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(rng.uniform(0.5, 4.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # the last start runs until every decision is delivered to every hook
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            records = DecisionLog(str(store_dir)).records()
            if len(records) == 4 and all(
                r.status is DeliveryStatus.DELIVERED for r in records.values()
            ):
                break
            assert time.monotonic() < deadline, {
                k: (r.status, r.errors) for k, r in records.items()
            }
            time.sleep(0.5)
        # the decisions may all be delivered by earlier starts before this one has bound its
        # port: wait for this start's endpoint (and for it to report itself up)
        port = argv[argv.index("--metrics-port") + 1]
        body = b""
        while b"faultlens_serve_up 1.0" not in body:
            assert proc.poll() is None, "serve exited"
            assert time.monotonic() < deadline + 60, body[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read()
            except OSError:
                time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # Slurm's own records: each failover applied once, each escalation held once
    for name in ("fo-a", "fo-b"):
        job = slurm.job(jobs[name])
        assert job["Restarts"] == "1", (name, job)
        assert job["ExcNodeList"] == nodes[name]
        node = slurm.node(nodes[name])
        assert "DRAIN" in node["State"] and "faultlens failover" in node["Reason"]
    for name in ("esc-c", "esc-d"):
        job = slurm.job(jobs[name])
        assert job["Restarts"] == "1" and job["Priority"] == "0", (name, job)  # one requeuehold
        assert "faultlens escalate" in job["Comment"]
    # no healthy node drained
    culprits = {nodes["fo-a"], nodes["fo-b"]}
    assert {n for n in slurm.nodes if "DRAIN" in slurm.node(n)["State"]} == culprits
    pages = [a for a in slurm.alerts() if a["labels"]["job"] in ("esc-c", "esc-d")]
    assert sorted(a["labels"]["job"] for a in pages) == ["esc-c", "esc-d"]
    return {
        "kills": kills,
        "decisions": len(records),
        "requeues": {n: slurm.job(jobs[n])["Restarts"] for n in jobs},
        "pages": len(pages),
        "seconds": round(time.monotonic() - t0, 1),
    }
