"""A real Slurm cluster for the tests: a private munge, slurmctld and four slurmd (`slurmd -N
node-K`, one host, loopback) and a prometheus-alertmanager, all from Debian's packages, in one
temporary directory; started once per session, stopped by pid.

`start_cluster(directory)` returns a SlurmCluster or raises ClusterUnavailable with the reason
(packages missing, not root, a daemon that does not come up); the session fixture `slurm_cluster`
(tests/conftest.py) turns that reason into a skip that names it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

NODES = ("node-0", "node-1", "node-2", "node-3")
PROGRAMS = (
    "munged",
    "munge",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "sinfo",
    "squeue",
    "scancel",
    "prometheus-alertmanager",
)
PACKAGES = "slurm-wlm munge prometheus-alertmanager"


class ClusterUnavailable(RuntimeError):
    """The cluster cannot run here; the message says why."""


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


SLURM_CONF = """\
ClusterName=fl
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/slurmd-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldPort={ctld_port}
FirstJobId={first_job_id}
MpiDefault=none
JobRequeue=1
MinJobAge=600
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
SchedulerParameters=sched_interval=1
NodeName=node-[0-3] NodeHostname=localhost NodeAddr=127.0.0.1 Port={node_ports} CPUs=2 \
RealMemory=2000 State=UNKNOWN
PartitionName=train Nodes=node-[0-3] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

ALERTMANAGER_CONF = """\
route:
  receiver: faultlens-tests
  group_wait: 1s
receivers:
  - name: faultlens-tests
"""


def _parse_record(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line -> {key: value}; values may contain spaces (Reason,
    Comment), so a key starts at each ` Key=`."""
    fields: dict[str, str] = {}
    parts = re.split(r" (?=[A-Za-z][A-Za-z0-9_:/]*=)", line.strip())
    for part in parts:
        key, _, value = part.partition("=")
        fields[key] = value
    return fields


@dataclass
class SlurmCluster:
    directory: Path
    conf: Path
    munge_socket: Path
    alertmanager_url: str
    nodes: tuple[str, ...] = NODES
    pids: dict[str, int] = field(default_factory=dict)

    # -- commands ----------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**env, "SLURM_CONF": str(self.conf), **extra}

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> str:
        result = subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)}: exit {result.returncode}: {result.stderr.strip()}"
            )
        return result.stdout

    def sbatch(self, script: Path | str, *args: str) -> str:
        out = self.run("sbatch", "--parsable", *args, str(script))
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        return _parse_record(self.run("scontrol", "show", "job", "-o", job_id))

    def node(self, name: str) -> dict[str, str]:
        return _parse_record(self.run("scontrol", "show", "node", "-o", name))

    def wait_job(self, job_id: str, states: set[str], timeout: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        record: dict[str, str] = {}
        while time.monotonic() < deadline:
            record = self.job(job_id)
            if record.get("JobState") in states:
                return record
            time.sleep(0.3)
        raise AssertionError(
            f"job {job_id} not in {sorted(states)} within {timeout}s: "
            f"{record.get('JobState')} {record.get('Reason')}"
        )

    def idle_nodes(self) -> set[str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return {n for n, state in (line.split() for line in out.splitlines()) if state == "idle"}

    def alerts(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.alertmanager_url}/api/v2/alerts", timeout=5) as r:
            return json.loads(r.read())

    def reset(self, timeout: float = 60.0) -> None:
        """Between tests: cancel every job, resume every node, wait until all are idle."""
        self.run("scancel", "--full", "-u", "root", check=False)
        self.run("scancel", "-u", "root", check=False)
        for name in self.nodes:
            self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.idle_nodes() == set(self.nodes):
                    return
            except RuntimeError:
                pass
            time.sleep(0.3)
        raise ClusterUnavailable(
            f"nodes not idle within {timeout}s: {self.run('sinfo', '-N', check=False)}"
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job (a batch step outlives its slurmd otherwise), then stop the daemons by
        pid."""
        if "slurmctld" in self.pids:
            self.run("scancel", "--full", "-u", "root", check=False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if not self.run("squeue", "-h", "-o", "%i").strip():
                        break
                except (RuntimeError, subprocess.SubprocessError, OSError):
                    break
                time.sleep(0.3)
        for pid in reversed(list(self.pids.values())):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 10
        for pid in self.pids.values():
            while time.monotonic() < deadline:
                # a child of this process (the Alertmanager) stays a zombie, which kill(pid, 0)
                # still finds, until it is reaped: reap it, or its stop waits out the deadline
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def missing_reason() -> str | None:
    """Why the cluster cannot run here, or None."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return (
            f"a real Slurm cluster needs {', '.join(missing)} (apt-get install {PACKAGES}; "
            ".ci/run installs them)"
        )
    if os.geteuid() != 0:
        return "a real Slurm cluster needs root (slurmd runs jobs as their users)"
    return None


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _read_pid(path: Path, timeout: float = 15.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return int(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise ClusterUnavailable(f"{path}: no pid within {timeout}s")


def start_cluster(directory: Path) -> SlurmCluster:
    reason = missing_reason()
    if reason:
        raise ClusterUnavailable(reason)
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o755)
    for sub in ("state", "log", "munge", "alertmanager", *(f"spool/slurmd-{n}" for n in NODES)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "munge").chmod(0o711)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = d / "munge" / "munge.socket"
    ctld_port, am_port = free_ports(2)
    # Slurm wants a port range for the nodes of one NodeName line: find 4 consecutive free ports
    base = _consecutive_free_ports(len(NODES))
    conf = d / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            d=d,
            munge_socket=munge_socket,
            ctld_port=ctld_port,
            # job ids of their own: a Slurm job's rendezvous port follows its id, so two clusters
            # side by side (pytest-xdist workers, two checkouts) must not both start at job 1
            first_job_id=random.SystemRandom().randint(1, 9000),
            node_ports=f"{base}-{base + len(NODES) - 1}",
        )
    )
    (d / "alertmanager.yml").write_text(ALERTMANAGER_CONF)
    cluster = SlurmCluster(d, conf, munge_socket, f"http://127.0.0.1:{am_port}")
    logs = d / "log"
    try:
        subprocess.run(
            [
                _program("munged"),
                "--force",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--log-file={logs / 'munged.log'}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        cluster.pids["munged"] = _read_pid(d / "munge" / "munged.pid")
        env = cluster.env()
        subprocess.run(
            [_program("slurmctld"), "-f", str(conf)],
            env=env,
            check=True,
            capture_output=True,
            timeout=30,
        )
        cluster.pids["slurmctld"] = _read_pid(d / "slurmctld.pid")
        for name in NODES:
            subprocess.run(
                [_program("slurmd"), "-f", str(conf), "-N", name],
                env=env,
                check=True,
                capture_output=True,
                timeout=30,
            )
            cluster.pids[f"slurmd-{name}"] = _read_pid(d / f"slurmd-{name}.pid")
        am_log = (logs / "alertmanager.log").open("wb")
        am = subprocess.Popen(
            [
                _program("prometheus-alertmanager"),
                f"--config.file={d / 'alertmanager.yml'}",
                f"--storage.path={d / 'alertmanager'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
            stdout=am_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        am_log.close()
        cluster.pids["alertmanager"] = am.pid
        cluster.wait_idle(60)
        _wait_http(f"{cluster.alertmanager_url}/-/ready", 30)
    except (ClusterUnavailable, subprocess.SubprocessError, OSError) as exc:
        cluster.stop()
        tail = ""
        for log in sorted(logs.glob("*.log")):
            tail += f"\n--- {log.name}\n" + "\n".join(
                log.read_text(errors="replace").splitlines()[-5:]
            )
        raise ClusterUnavailable(f"the Slurm cluster did not start: {exc}{tail}") from None
    return cluster


def _consecutive_free_ports(count: int) -> int:
    for _ in range(50):
        base = free_ports(1)[0]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise ClusterUnavailable(f"no {count} consecutive free ports on 127.0.0.1")


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise ClusterUnavailable(f"{url}: not ready within {timeout}s")
