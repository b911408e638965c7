"""The Slurm decision hook (`type: slurm` in a hooks file): every action the policy emits, carried
out on the Slurm job named by the decision's job id (the job *name*; the job number changes) and
on its nodes.

    failover  drain the excluded nodes (reason names the incident), requeue the job with them added
              to its ExcNodeList, the restore point in `<state_dir>/restore/<job>.json` (the
              launcher puts it in the training environment); it starts again as soon as
              resources allow (StartTime=now, see `_start_now`), not after Slurm's requeue delay
    restart   requeue the job, nothing excluded, newest good checkpoint (no restore point
              written); started again as soon as resources allow
    escalate  requeue-and-hold the job (a running one stops), the reason in its comment; paging is
              the alertmanager hook's job
    notify    the reason in the job's comment; the job runs on
    drain     drain the nodes; no job is touched

Idempotent by decision id, twice over: an applied decision leaves `<state_dir>/applied/<id>`
(refused next time), and a requeue happens only while the job's Restarts count still equals the
decision's attempt (Slurm's own record: a decision delivered again after a kill between the requeue
and the marker does not requeue a second time; a job Slurm requeued itself, NODE_FAIL under
--requeue, gets the decision's nodes drained and its comment, not a second requeue). A failing
Slurm command raises HookError with its stderr: the deliverer retries it and keeps the error in
the decision's delivery status.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from faultlens.attribution.decision import Action, Decision
from faultlens.collectors.store.atomic import atomic_write
from faultlens.controller.hooks.base import HookError, PermanentHookError, RetryPolicy
from faultlens.controller.slurm.commands import Slurm, SlurmCommandError
from faultlens.controller.slurm.restore import restore_path

#: job states in which `scontrol requeue` applies (a pending job is already queued)
REQUEUEABLE = {
    "RUNNING",
    "COMPLETING",
    "COMPLETED",
    "FAILED",
    "NODE_FAIL",
    "TIMEOUT",
    "CANCELLED",
    "PREEMPTED",
    "SUSPENDED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}
FINISHED = REQUEUEABLE - {"RUNNING", "COMPLETING", "SUSPENDED"}
REASON_CHARS = 200
#: seconds between the requeue and StartTime=now: the relaunch credential must be issued in a
#: later second than the old run's revocation (Slurm compares whole seconds)
REVOKE_MARGIN_S = 2.0


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """Text safe as one scontrol value: one line, no '=' (it would start a new key), bounded."""
    flat = " ".join(text.replace("=", ":").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class SlurmHook:
    def __init__(
        self,
        state_dir: str | Path,
        *,
        name: str = "slurm",
        slurm: Slurm | None = None,
        slurm_env: Mapping[str, str] | None = None,
        drain_nodes: bool = True,
        retry: RetryPolicy | None = None,
        requeue_wait_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.requeue_wait_s = requeue_wait_s
        self.sleep = sleep
        self.name = name
        self.slurm = slurm or Slurm(env=dict(slurm_env or {}))
        self.drain_nodes = drain_nodes
        self.retry = retry

    # -- the record of applied decisions ----------------------------------------------------------
    def _marker(self, decision_id: str) -> Path:
        return self.state_dir / "applied" / decision_id

    def applied(self, decision_id: str) -> bool:
        return self._marker(decision_id).exists()

    def _mark(self, decision: Decision, what: str) -> None:
        atomic_write(self._marker(decision.decision_id), f"{decision.action.value} {what}\n")

    # -- delivery ---------------------------------------------------------------------------------
    def deliver(self, decision: Decision, document: str) -> None:
        if not all(c.isalnum() or c in "._-" for c in decision.decision_id):
            raise PermanentHookError(f"decision id {decision.decision_id!r}: not a safe name")
        if self.applied(decision.decision_id):
            return  # refused: this decision was carried out already
        action = decision.action
        if action is Action.UNKNOWN:
            raise PermanentHookError(f"{decision.decision_id}: action 'unknown': nothing to do")
        try:
            what = self._apply(decision)
        except SlurmCommandError as exc:
            raise HookError(f"slurm ({action.value} {decision.decision_id}): {exc}") from None
        self._mark(decision, what)

    def _wait_pending(self, job_id: str, nodes: list[str]) -> None:
        """Until the requeued job pends and its old nodes are done with it (not COMPLETING)."""
        deadline = time.monotonic() + self.requeue_wait_s
        while True:
            state = self.slurm.job(job_id).get("JobState")
            busy = [n for n in nodes if "COMPLETING" in self.slurm.node(n).get("State", "")]
            if state == "PENDING" and not busy:
                return
            if time.monotonic() > deadline:
                raise SlurmCommandError(
                    f"job {job_id} requeued but {state}"
                    + (f", {','.join(busy)} still completing" if busy else "")
                    + f" after {self.requeue_wait_s:g}s"
                )
            self.sleep(0.2)

    def _start_now(
        self, job_id: str, job: dict[str, str], requeued_at: float, fields: dict[str, str]
    ) -> None:
        """Let the requeued job start as soon as resources allow, not after Slurm's requeue delay
        (its credential lifetime, 120 s by default). Slurm holds a requeued job (Reason BeginTime)
        because each node revokes the old run's credential when it kills it, and refuses a launch
        credential issued in the same second or before ("Job credential revoked": the new run
        fails at once). So: wait until the job pends and its old nodes are done with it, and
        REVOKE_MARGIN_S after the requeue, then StartTime=now (set before it pends, Slurm's own
        requeue would overwrite it)."""
        self._wait_pending(job_id, self.slurm.hostnames(job.get("NodeList", "")))
        rest = requeued_at + REVOKE_MARGIN_S - time.monotonic()
        if rest > 0:
            self.sleep(rest)
        fields["StartTime"] = "now"

    def _comment(self, job_id: str, tag: str) -> None:
        """The decision in the job's comment; a job Slurm no longer lets change keeps its own."""
        try:
            self.slurm.update("JobId", job_id, Comment=tag)
        except SlurmCommandError as exc:
            if self.slurm.job(job_id).get("JobState") not in FINISHED:
                raise
            del exc

    def _tag(self, decision: Decision) -> str:
        return one_line(
            f"faultlens {decision.action.value} {decision.decision_id}: "
            f"{decision.incident_class.value}/{decision.cause.value}: "
            f"{decision.reason}"
        )

    def _nodes(self, decision: Decision) -> list[str]:
        return list(decision.exclude_nodes or decision.culprit.nodes)

    def _job(self, decision: Decision) -> dict[str, str]:
        if not decision.job_id:
            raise PermanentHookError(
                f"{decision.decision_id}: {decision.action.value} names no job"
            )
        job = self.slurm.job_named(decision.job_id)
        if job is None:
            raise PermanentHookError(
                f"{decision.decision_id}: no Slurm job named {decision.job_id!r}"
            )
        return job

    def _apply(self, decision: Decision) -> str:
        action = decision.action
        tag = self._tag(decision)
        if action is Action.DRAIN:
            nodes = self._nodes(decision)
            if not nodes:
                raise PermanentHookError(f"{decision.decision_id}: drain names no node")
            self.slurm.drain(nodes, tag)
            return "drained " + ",".join(nodes)
        job = self._job(decision)
        job_id = job["JobId"]
        if action is Action.NOTIFY:
            if job.get("JobState") in FINISHED:
                return f"job {job_id} finished: no comment"
            self.slurm.update("JobId", job_id, Comment=tag)
            return f"commented job {job_id}"
        if action is Action.ESCALATE:
            state = job.get("JobState")
            if state in REQUEUEABLE:
                self.slurm.run("scontrol", "requeuehold", job_id)
            elif state == "PENDING" and job.get("Priority") != "0":
                self.slurm.run("scontrol", "hold", job_id)
            self.slurm.update("JobId", job_id, Comment=tag)
            return f"held job {job_id}"
        # failover and restart: requeue (once per attempt: Slurm's Restarts count says)
        exclude = self._nodes(decision) if action is Action.FAILOVER else []
        if exclude and self.drain_nodes:
            self.slurm.drain(exclude, tag)
        if action is Action.FAILOVER and decision.restore is not None and decision.job_id:
            restore: dict[str, Any] = {
                "decision_id": decision.decision_id,
                "tier": decision.restore.tier,
                "step": decision.restore.step,
                "uri": decision.restore.uri,
            }
            atomic_write(restore_path(self.state_dir, decision.job_id), json.dumps(restore) + "\n")
        restarts = int(job.get("Restarts", "0") or 0)
        already = decision.attempt is not None and restarts > decision.attempt
        if already and job.get("JobState") != "PENDING":
            # requeued before this delivery: by an earlier one cut off after its update, or by
            # Slurm itself (a node that failed under a --requeue job: NODE_FAIL). The nodes are
            # drained above; the decision still goes on the job's record
            self._comment(job_id, tag)
            return f"job {job_id} already requeued (restarts {restarts})"
        fields = {"Comment": tag}
        if not already and job.get("JobState") in REQUEUEABLE:
            self.slurm.run("scontrol", "requeue", job_id)
            requeued_at = time.monotonic()
            # the decision on the job's record as it takes effect, not once the job may start
            # again (a lost node keeps the job completing until Slurm marks it down)
            self._comment(job_id, tag)
            self._start_now(job_id, job, requeued_at, fields)
        elif already:
            # requeued by an earlier delivery that was cut off before its update
            self._start_now(job_id, job, time.monotonic(), fields)
        if exclude:
            before = self.slurm.hostnames(job.get("ExcNodeList", ""))
            fields["ExcNodeList"] = ",".join(sorted({*before, *exclude}))
        self.slurm.update("JobId", job_id, **fields)
        return f"requeued job {job_id}" + (f" excluding {fields['ExcNodeList']}" if exclude else "")


def slurm_env_from(options: Mapping[str, Any]) -> dict[str, str]:
    """The Slurm client environment of a hook config: `slurm_conf` -> SLURM_CONF."""
    conf = options.get("slurm_conf") or os.environ.get("SLURM_CONF")
    return {"SLURM_CONF": str(conf)} if conf else {}
