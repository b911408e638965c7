"""faultlens on a real Slurm cluster (tests/slurm_cluster.py: munge, slurmctld, four slurmd on
loopback, an Alertmanager): a tiny gloo DDP job (tests/slurm_jobs/ddp_train.py, 2 nodes x 2 ranks)
submitted as docs/slurm.md says, `faultlens serve` with the Slurm hook and the pager following the
store, one scenario after another; each scored (the action Slurm's records show, the job's end, no
healthy node drained) and timed (fault -> Slurm action, fault -> training resumed).

    PYTHONPATH=. python bench/bench_slurm.py [--only NAME ...] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Figure, Section, emit, write_section
from tests.slurm_cluster import free_ports, start_cluster

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "tests" / "slurm_jobs" / "ddp_train.py"


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str = ""  # DDP_TEST_FAULT ("" none)
    expect: tuple[str, ...] = ()  # the actions Slurm's records show, in order
    cpu_hog: bool = False
    fault_attempt: str = "0"  # DDP_TEST_FAULT_ATTEMPT ("all": the fault follows the code)
    node_loss: bool = False  # when the fault marks: the node's slurmd and its job step killed
    xid_node: str | None = None  # this node's agent replays Xid 79 (recorded NVML) on GPU 0
    env: tuple[tuple[str, str], ...] = ()  # the training job's settings for this scenario
    supervisor: str | None = None  # the same kind under `faultlens run` (rules/campaign.yaml)

    @property
    def culprit(self) -> str | None:
        return self.fault.split(":")[1] if self.fault else None

    @property
    def fault_step(self) -> int | None:
        return int(self.fault.split(":")[3]) if self.fault else None


SCENARIOS = (
    Scenario("healthy", supervisor="healthy-end-of-job"),
    Scenario("healthy-cpu-hog", cpu_hog=True, supervisor="healthy-end-of-job-hog"),
    Scenario("sigkill-rank", "sigkill:node-1:1:12", ("failover",), supervisor="sigkill-one-rank"),
    Scenario("sigkill-rank-0", "sigkill:node-0:0:8", ("failover",)),
    Scenario(
        "exception-once", "exception:node-1:0:12", ("restart",), supervisor="exception-one-rank"
    ),
    Scenario(
        "exception-follows-code",
        "exception:node-1:0:12",
        ("restart", "escalate"),
        fault_attempt="all",
        supervisor="exception-follows-rank",
    ),
    Scenario(
        "stuck-rank",
        "stuck:node-1:0:12",
        ("failover",),
        # the step timer shows progress stop; the hang is live when the dumps are asked for
        env=(("DDP_TEST_STEP_TIMER", "1"), ("DDP_TEST_TIMEOUT_S", "120")),
        supervisor="stuck-sleep",
    ),
    Scenario(
        "node-loss",
        "mark:node-1:0:12",
        ("failover",),
        node_loss=True,
        env=(("DDP_TEST_STEP_TIMER", "1"), ("DDP_TEST_TIMEOUT_S", "120")),
        supervisor="node-loss",
    ),
    Scenario(
        "node-loss-in-collective",
        "mark:node-1:1:7",
        ("failover",),
        node_loss=True,
        # the marking rank holds back, so the other ranks wait inside the gradient all_reduce
        # when the node goes (before it, the node went mid-step)
        env=(
            ("DDP_TEST_STEP_TIMER", "1"),
            ("DDP_TEST_TIMEOUT_S", "120"),
            ("DDP_TEST_MARK_HOLD_S", "3"),
        ),
    ),
    Scenario("xid79", "cuda:node-1:0:12", ("failover",), xid_node="node-1", supervisor="xid79"),
    Scenario(
        "slow-worker",
        "slow:node-1:0:10",
        # the policy's answer (rules/policy.yaml `straggler`): one slow worker is failed over only
        # when the step time saved over the job's remaining time outweighs a restart plus the work
        # lost; this job declares no length and `faultlens serve` runs the shipped policy
        # (remaining_s null: unknown), so the slowdown is notified and the job runs on. The
        # anchor, slow-rank under `faultlens run`, expects a failover because the campaign tells
        # the supervisor a day of training remains (assume_remaining_s: 86400)
        ("notify",),
        # long enough that the notify lands on a running job at load 40 (80 steps ended 4 s
        # before the straggler was decided: a finished job takes no comment)
        env=(("STEPS", "200"), ("DDP_TEST_SLOW_S", "0.15"), ("DDP_TEST_STEP_TIMER", "1")),
        supervisor="slow-rank",
    ),
)
GPUS = """\
format_version: 1
description: "{node}: two GPUs, recorded (bench/bench_slurm.py)"
gpus:
  - {{index: 0, uuid: GPU-{tag}-0000, pci_bus_id: "00000000:18:00.0", name: NVIDIA H100 80GB HBM3}}
  - {{index: 1, uuid: GPU-{tag}-0001, pci_bus_id: "00000000:2A:00.0", name: NVIDIA H100 80GB HBM3}}
timeline:
{timeline}
"""
XID_79 = """\
  - {at: 1.0, gpu: 0, event: {kind: xid, code: 79, message: "GPU has fallen off the bus."}}
  - {at: 1.05, gpu: 0, lost: "GPU is lost (NVML_ERROR_GPU_IS_LOST)"}"""


def write_timelines(directory: Path, nodes, xid_node: str) -> str:
    """One recorded NVML timeline per node: healthy, but `xid_node`'s GPU 0 falls off the bus 1 s
    after its agent opens it (the crash that follows is within the crash rules' window)."""
    directory.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        timeline = XID_79 if node == xid_node else "  []"
        tag = node.encode().hex()[-8:]
        text = GPUS.format(node=node, tag=tag, timeline=timeline)
        if node != xid_node:
            text = text.replace("timeline:\n  []", "timeline: []")
        (directory / f"{node}.yaml").write_text(text)
    return str(directory / "{node}.yaml")
TAG = re.compile(r"faultlens (\w+) (\S+):")


def _parent(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    return None


def lose_node(cluster, node: str, work: Path) -> None:
    """Node loss, as a host that dies takes everything on it: the node's slurmd, the job step's
    slurmstepd on it and every process of this scenario's job step there (found by SLURMD_NODENAME
    and the scenario's directory in its environment) SIGKILLed together."""
    victims = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURMD_NODENAME={node}".encode() in environ and (
            f"CKPT_DIR={work / 'ckpt'}".encode() in environ
        ):
            victims.append(int(proc.name))
    stepds = set()
    for pid in victims:
        parent = _parent(pid)
        with contextlib.suppress(OSError):
            if parent and Path(f"/proc/{parent}/comm").read_text().startswith("slurmstepd"):
                stepds.add(parent)
    for pid in [cluster.pids[f"slurmd-{node}"], *sorted(stepds), *victims]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def revive_node(cluster, node: str) -> None:
    """Start the lost node's slurmd again (the next scenario needs four nodes)."""
    subprocess.run(
        ["slurmd", "-f", str(cluster.conf), "-N", node],
        env=cluster.env(),
        check=True,
        capture_output=True,
        timeout=30,
    )
    pid_file = cluster.directory / f"slurmd-{node}.pid"
    old = cluster.pids.get(f"slurmd-{node}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # the killed slurmd's pid file stays until the new one writes its own
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            if pid != old:
                cluster.pids[f"slurmd-{node}"] = pid
                break
        time.sleep(0.2)


def run_scenario(
    cluster, sc: Scenario, root: Path, bin_dir: Path, *, until_action: bool = False
) -> dict:
    """One scenario, scored on Slurm's records; `until_action`: stop watching once the expected
    number of actions is on the job's record (a test's short form: the job's end is not waited
    for, so it is not scored)."""
    work = root / sc.name
    work.mkdir()
    name = f"sc-{sc.name}"
    agent = ""
    if sc.xid_node:
        timelines = write_timelines(work / "gpus", cluster.nodes, sc.xid_node)
        agent = f"--agent-sources nvml --agent-nvml-timeline '{timelines}' "
    batch = work / "train.sbatch"
    batch.write_text(
        textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=1
        #SBATCH --requeue
        exec faultlens slurm run --store {root}/store --state-dir {root}/state {agent}\\
            --work-dir {root}/work --nproc-per-node 2 -- {TRAIN}
        """)
    )
    env = {
        **cluster.env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "CKPT_DIR": str(work / "ckpt"),
        "DONE_FILE": str(work / "done.json"),
        "FAULT_FILE": str(work / "fault.txt"),
        "STEPS": "24",
        "CKPT_EVERY": "5",
        "STEP_S": "0.1",
        "DDP_TEST_FAULT": sc.fault,
        "DDP_TEST_FAULT_ATTEMPT": sc.fault_attempt,
        "DDP_TEST_TIMEOUT_S": "20",
        **dict(sc.env),
    }
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 if sc.cpu_hog else 0)
    ]
    lost, lost_at_ckpt = False, 0
    try:
        out = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--job-name",
                name,
                "--output",
                str(work / "out-%j.txt"),
                "--open-mode=append",
                str(batch),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        job = out.stdout.strip().split(";")[0]
        fault_ts = None
        seen: dict[str, tuple[str, float]] = {}  # decision id -> (action, first seen)
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            record = cluster.job(job)
            if fault_ts is None and (work / "fault.txt").exists():
                fault_ts = float((work / "fault.txt").read_text().split()[0])
                if sc.node_loss and not lost:
                    # the fault is the loss itself: when the node went, and the newest
                    # checkpoint complete by then (training may have gone past the mark while
                    # this loop waited for its turn on a loaded machine)
                    lose_node(cluster, sc.culprit, work)
                    fault_ts, lost = time.time(), True
                    lost_at_ckpt = max(
                        (int(p.stem.split("-")[1]) for p in (work / "ckpt").glob("step-*.pt")),
                        default=0,
                    )
            match = TAG.match(record.get("Comment", ""))
            if match and match.group(2) not in seen:
                seen[match.group(2)] = (match.group(1), time.time())
            actions = [a for a, _ in seen.values()]
            state = record.get("JobState")
            if actions and actions[-1] == "escalate" and record.get("Priority") == "0":
                break
            if state in ("COMPLETED", "FAILED", "CANCELLED") and len(actions) >= len(sc.expect):
                break
            if until_action and sc.expect and len(actions) >= len(sc.expect):
                break
            time.sleep(0.2)
        record = cluster.job(job)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if lost:
            revive_node(cluster, sc.culprit)
            # what the lost node's ranks left in shared memory (a real node loses it on reboot)
            from faultlens.collectors.training.heartbeat import default_dir

            for left in default_dir().glob(f"slurm-{job}-a*-{sc.culprit}"):
                shutil.rmtree(left, ignore_errors=True)
    done = json.loads((work / "done.json").read_text()) if (work / "done.json").exists() else {}
    drained = sorted(n for n in cluster.nodes if "DRAIN" in cluster.node(n)["State"])
    observed = tuple(a for a, _ in sorted(seen.values(), key=lambda v: v[1]))
    first_action = min((t for _, t in seen.values()), default=None)
    healthy_drained = [n for n in drained if not (n == sc.culprit and "failover" in observed)]
    finished = record.get("JobState") == "COMPLETED"
    resumed_s = (done["started"] - fault_ts) if done and fault_ts and done["attempt"] else None
    # the restore point the policy chose: the newest checkpoint before the fault
    newest = (sc.fault_step - 1) // 5 * 5 if sc.fault_step else None
    if lost:
        newest = lost_at_ckpt
    restored_right = True
    if sc.expect and sc.expect[-1] in ("failover", "restart"):
        restored_right = bool(done) and done.get("start") == newest
        if sc.expect[-1] == "failover":
            restored_right = restored_right and sc.culprit not in done.get("nodes", [sc.culprit])
    paged = None
    if "escalate" in sc.expect:
        paged = any(a["labels"].get("job") == name for a in cluster.alerts())
    if sc.expect and sc.expect[-1] == "escalate":
        ended_right = record.get("Priority") == "0" and bool(paged)
    else:
        ended_right = finished
    right = observed == sc.expect and not healthy_drained and ended_right and restored_right
    return {
        "scenario": sc.name,
        "expected": ",".join(sc.expect) or "none",
        "observed": ",".join(observed) or "none",
        "right": right,
        "finished": finished,
        "restored_right": restored_right,
        "paged": paged,
        "healthy_drained": len(healthy_drained),
        "action_s": None if first_action is None or fault_ts is None else first_action - fault_ts,
        "resumed_s": resumed_s,
        "job_state": record.get("JobState"),
        "restarts": record.get("Restarts"),
    }


def supervisor_resumed_s(run: Path) -> float | None:
    """Under `faultlens run`: the first landed fault to the first step of a later attempt."""
    from faultlens.attribution.reading.store import Store
    from faultlens.controller.lab.plan import read_injections

    landed = [r["ts"] for r in read_injections(run / "lab") if r.get("ts") is not None]
    if not landed or not (run / "store").exists():
        return None
    store = Store(str(run / "store"))
    try:
        rows = store.query("SELECT min(start_ts) AS t FROM steps WHERE attempt >= 1").to_pylist()
    except Exception:  # no steps table: no later attempt
        return None
    finally:
        store.close()
    first = rows[0]["t"] if rows else None
    return None if first is None else first.timestamp() - min(landed)


def load_timeout_s(base_s: float = 200.0) -> float:
    """A scenario timeout that fits the machine's load: the campaign's 200 s is for a quiet
    machine; at load L on N cores every process gets about N/L of a core, so the same run takes
    about L/N times as long (at most 30 minutes)."""
    cores = os.cpu_count() or 1
    return min(1800.0, base_s * max(1.0, os.getloadavg()[0] / cores))


def campaign_file(names: list[str], out: Path, timeout_s: float) -> Path:
    """rules/campaign.yaml with the named scenarios' timeout raised to `timeout_s` (their own
    timeout when longer), written under `out`."""
    import yaml

    doc = yaml.safe_load((REPO / "rules" / "campaign.yaml").read_text())
    doc["defaults"]["timeout_s"] = max(float(doc["defaults"].get("timeout_s", 0)), timeout_s)
    for scenario in doc["scenarios"]:
        if scenario.get("name") in names and "timeout_s" in scenario:
            scenario["timeout_s"] = max(float(scenario["timeout_s"]), timeout_s)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "campaign.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_supervisor(names: list[str], out: Path, timeout_s: float | None = None) -> list[dict]:
    """The same kinds of fault under `faultlens run` (the supervisor's campaign), this run, each
    given `timeout_s` (default: load_timeout_s() as the comparison starts)."""
    timeout_s = timeout_s if timeout_s is not None else load_timeout_s()
    scenarios = campaign_file(names, out, timeout_s)
    subprocess.run(
        [
            *(sys.executable, "-m", "faultlens.controller.cli.main", "campaign"),
            *("--scenarios", str(scenarios), "--only", *names, "--out", str(out)),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=len(names) * (timeout_s + 120),
        check=False,
    )
    return supervisor_rows(out)


def supervisor_rows(out: Path) -> list[dict]:
    """The rows of the scenarios a `faultlens campaign --out OUT` finished (its results.jsonl)."""
    rows = []
    results = out / "results.jsonl"
    for line in results.read_text().splitlines() if results.exists() else []:
        r = json.loads(line)
        first = r["checks"][0] if r["checks"] else {}
        rows.append(
            {
                "scenario": r["name"],
                "right": r["ok"],
                "observed": ",".join(i["action"] for i in r["incidents"] if i.get("action"))
                or "none",
                "action_s": first.get("latency_decision_s"),
                "resumed_s": supervisor_resumed_s(out / r["name"]),
                "problems": r["problems"],
            }
        )
    return rows


def cli_on_path(directory: Path) -> Path:
    """A `faultlens` command, as an install gives it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "faultlens").write_text(
        f'#!/bin/sh\nexec {sys.executable} -m faultlens.controller.cli.main "$@"\n'
    )
    (directory / "faultlens").chmod(0o755)
    return directory


def start_serve(cluster, root: Path) -> subprocess.Popen:
    """`faultlens serve` over <root>/store with the Slurm hook (state in <root>/state), the
    cluster's Alertmanager as the pager and the jobs' flight-recorder triggers under <root>/work
    (their `faultlens slurm run --work-dir`)."""
    (root / "hooks.yaml").write_text(
        textwrap.dedent(f"""\
        format_version: 1
        hooks:
          - {{type: slurm, name: slurm, state_dir: {root}/state, slurm_conf: {cluster.conf}}}
          - {{type: alertmanager, name: page, url: "{cluster.alertmanager_url}"}}
        """)
    )
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "faultlens.controller.cli.main", "serve"),
            *("--store", str(root / "store"), "--hooks", str(root / "hooks.yaml")),
            *("--interval", "0.5", "--metrics-port", str(free_ports(1)[0])),
            *("--fr-root", str(root / "work"), "--fr-wait", "10"),
        ],
        env={**cluster.env(), "PYTHONPATH": str(REPO)},
        stdout=(root / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--no-supervisor", action="store_true", help="skip the same kinds under `faultlens run`"
    )
    parser.add_argument(
        "--supervisor-timeout",
        type=float,
        default=None,
        metavar="S",
        help="each `faultlens run` scenario's timeout (default: the campaign's 200 s scaled by "
        "the load average per core when the comparison starts)",
    )
    parser.add_argument(
        "--serve-kills",
        type=int,
        default=0,
        help="also kill `faultlens serve` -9 this many times while it delivers (20: the issue's)",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        help="publish the rows a run printed (its JSON lines) without running",
    )
    parser.add_argument("--commit", help="with --from-json: the commit that run measured")
    parser.add_argument("--date", help="with --from-json: when that run measured (UTC)")
    parser.add_argument(
        "--note", action="append", default=[], help="a note on the run's conditions (repeatable)"
    )
    args = parser.parse_args()
    if args.from_json:
        lines = [
            json.loads(line)
            for line in args.from_json.read_text().splitlines()
            if line.startswith("{")
        ]
        publish(lines, args.commit, args.date, write=not args.no_write, notes=tuple(args.note))
        return
    chosen = [sc for sc in SCENARIOS if not args.only or sc.name in args.only]
    root = Path(tempfile.mkdtemp(prefix="faultlens-bench-slurm-"))
    cluster = start_cluster(root / "cluster")
    bin_dir = cli_on_path(root / "bin")
    serve = start_serve(cluster, root)
    lines = []
    try:
        for sc in chosen:
            cluster.reset()
            row = run_scenario(cluster, sc, root, bin_dir)
            emit("slurm", row)
            lines.append({"benchmark": "slurm", **row})
        if args.serve_kills:
            from tests.test_serve import serve_killed_nine

            cluster.reset()
            kill_dir = root / "serve-kill9"
            kill_dir.mkdir()
            try:
                seen = serve_killed_nine(
                    cluster, kill_dir, kill_dir / "store", kills=args.serve_kills, seed=35
                )
                row = {**seen, "right": True}
            except AssertionError as exc:
                row = {"kills": args.serve_kills, "right": False, "error": str(exc)[:500]}
            emit("slurm-serve-kill9", row)
            lines.append({"benchmark": "slurm-serve-kill9", **row})
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        cluster.stop()
    names = [sc.supervisor for sc in chosen if sc.supervisor]
    notes = list(args.note)
    if names and not args.no_supervisor:
        timeout = args.supervisor_timeout or load_timeout_s()
        notes.append(
            f"faultlens run anchors: each scenario's timeout {timeout:.0f} s (the campaign's "
            "200 s scaled by the load per core as they started)"
        )
        for row in run_supervisor(names, root / "supervisor", timeout):
            emit("slurm-supervisor", row)
            lines.append({"benchmark": "slurm-supervisor", **row})
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    load = f"load average {os.getloadavg()[0]:.0f} at the end of the run"
    publish(lines, commit, date, write=not args.no_write, notes=(load, *notes))


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def publish(
    lines: list[dict], commit: str, date: str, *, write: bool, notes: tuple[str, ...] = ()
) -> None:
    rows = [r for r in lines if r.get("benchmark", "slurm") == "slurm"]
    sup = {r["scenario"]: r for r in lines if r.get("benchmark") == "slurm-supervisor"}
    kills = [r for r in lines if r.get("benchmark") == "slurm-serve-kill9"]
    by_name = {sc.name: sc for sc in SCENARIOS}
    figures = []
    for r in rows:
        sc = by_name.get(r["scenario"])
        peer = sup.get(sc.supervisor) if sc and sc.supervisor else None
        figures.append(
            Figure(
                f"{r['scenario']}: action (right?)"
                + (f", fault -> action {r['action_s']:.1f} s" if r["action_s"] is not None else ""),
                f"{r['observed']} ({'right' if r['right'] else 'WRONG'})",
                r["expected"],
                anchor="-"
                if peer is None
                else f"{peer['scenario']}: {peer['observed']} "
                f"({'right' if peer['right'] else 'WRONG'})",
                commit=commit,
                date=date,
            )
        )
    pairs = [
        (r, sup[by_name[r["scenario"]].supervisor])
        for r in rows
        if by_name.get(r["scenario"])
        and by_name[r["scenario"]].supervisor
        and by_name[r["scenario"]].supervisor in sup
    ]
    peers = [p for _, p in pairs]

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or not b else f"{a / b:.1f}x"

    def both(key: str) -> tuple[list[float], list[float]]:
        kept = [(r[key], p[key]) for r, p in pairs if r[key] is not None and p[key] is not None]
        return [a for a, _ in kept], [b for _, b in kept]

    action_med = _median([r["action_s"] for r in rows])
    resumed_med = _median([r["resumed_s"] for r in rows])
    slurm_action, sup_action = both("action_s")
    slurm_resumed, sup_resumed = both("resumed_s")
    figures += [
        Figure(
            "scenarios right",
            f"{sum(r['right'] for r in rows)}/{len(rows)}",
            "all",
            anchor=f"{sum(p['right'] for p in peers)}/{len(peers)} under faultlens run"
            if peers
            else "-",
            commit=commit,
            date=date,
        ),
        Figure(
            "healthy nodes drained",
            str(sum(r["healthy_drained"] for r in rows)),
            "0",
            commit=commit,
            date=date,
        ),
        Figure(
            "resumed jobs finished from the policy's restore point",
            f"{sum(bool(r.get('restored_right')) for r in rows if r['resumed_s'] is not None)}"
            f"/{sum(r['resumed_s'] is not None for r in rows)}",
            "all",
            commit=commit,
            date=date,
        ),
        Figure(
            f"median fault -> Slurm action, all (n={sum(r['action_s'] is not None for r in rows)})",
            _s(action_med),
            commit=commit,
            date=date,
        ),
        Figure(
            f"median fault -> training resumed, all "
            f"(n={sum(r['resumed_s'] is not None for r in rows)})",
            _s(resumed_med),
            commit=commit,
            date=date,
        ),
        Figure(
            f"median fault -> Slurm action, kinds run both ways (n={len(slurm_action)})",
            _s(_median(slurm_action)),
            anchor=f"{_s(_median(sup_action))} fault -> decision under faultlens run",
            ratio=ratio(_median(slurm_action), _median(sup_action)),
            commit=commit,
            date=date,
        ),
        Figure(
            f"median fault -> training resumed, kinds run both ways (n={len(slurm_resumed)})",
            _s(_median(slurm_resumed)),
            anchor=f"{_s(_median(sup_resumed))} under faultlens run",
            ratio=ratio(_median(slurm_resumed), _median(sup_resumed)),
            commit=commit,
            date=date,
        ),
    ]
    for k in kills:
        figures.append(
            Figure(
                f"`faultlens serve` killed -9 {k['kills']} times while delivering: decisions "
                "lost / applied twice (Slurm's records)",
                "0 / 0" if k["right"] else f"WRONG: {k.get('error', '')[:80]}",
                "0 / 0",
                commit=commit,
                date=date,
            )
        )
    section = Section(
        title="On Slurm: fault -> Slurm action",
        compares="A tiny gloo DDP job (2 nodes x 2 ranks) under `faultlens slurm run` on a real "
        "Slurm 22.05 (munge, slurmctld, four slurmd on loopback), `faultlens serve` with "
        "the Slurm hook and an Alertmanager pager; each scenario scored on Slurm's own "
        "job and node records (the action is the faultlens tag in the job's Comment, one per "
        "decision). Anchor: the same kind of fault under `faultlens run` (the supervisor's "
        "campaign scenario named), measured in the same bench run.",
        commands=("PYTHONPATH=. python bench/bench_slurm.py --serve-kills 20",),
        figures=tuple(figures),
        notes=(
            "fault -> Slurm action: the fault to the first faultlens tag in the job's record; "
            "under faultlens run the anchor is the fault to the decision.",
            "fault -> training resumed: the fault to the first step of the next attempt "
            "(requeue, scheduling, srun, torchrun rendezvous and imports on 2 shared cores); a "
            "requeued job starts once it pends and 2 s after the requeue, not after Slurm's "
            "120 s requeue delay.",
            "The machine: 2 cores shared with other work; times are wall clock under its load "
            "(the run's load: the next note, when given).",
            *notes,
        ),
    )
    if write:
        write_section(REPO / "docs" / "benchmarks.md", section)


if __name__ == "__main__":
    main()
