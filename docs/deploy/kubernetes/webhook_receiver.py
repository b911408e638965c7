"""Receive faultlens decisions in a Kubernetes cluster (the operator-hook sketch of docs/operations.md, runnable).

faultlens' webhook hook POSTs each decision (JSON, schema faultlens.decision/1) signed with HMAC-SHA256 in
X-Faultlens-Signature. This receiver checks the signature, acknowledges a decision it has already handled (delivery
is at-least-once), and acts through kubectl:

- failover: cordon every excluded node; write the restore choice into the ConfigMap `<job>-faultlens-restore`
  (keys tier, step, uri, attempt, decision_id) that the job's pods read at start; delete the job's pods (label
  `faultlens.io/job=<job>`) so the job's own controller (JobSet, PyTorchJob, a Job with a pod failure policy)
  recreates them, on other nodes, from that checkpoint.
- drain: cordon the nodes (a proactive decision: no pod is touched; evict them with `kubectl drain` when due).
- escalate: annotate the job's pods with the reason and touch nothing else: a human takes it from here.

    FAULTLENS_WEBHOOK_SECRET=... python webhook_receiver.py --port 8080 --namespace training

Run it as a Deployment with a ServiceAccount allowed to patch nodes, apply ConfigMaps and delete/annotate pods in
the namespace; point the webhook hook's url at its Service (docs/deploy/kubernetes/hooks.yaml).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from controller.hooks.webhook import DECISION_ID_HEADER, SIGNATURE_HEADER, verify_signature

log = logging.getLogger("faultlens.k8s-receiver")
JOB_LABEL = "faultlens.io/job"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

Kubectl = Callable[[Sequence[str], str | None], None]


def run_kubectl(args: Sequence[str], stdin: str | None = None) -> None:
    """The real boundary: kubectl with the pod's service account (or $KUBECONFIG)."""
    subprocess.run(["kubectl", *args], input=stdin, text=True, check=True, capture_output=True, timeout=60)


class DecisionReceiver:
    """Turns one decision into kubectl actions; remembers handled decision ids (in `state_file` when given)."""

    def __init__(self, namespace: str, kubectl: Kubectl = run_kubectl, state_file: Path | None = None) -> None:
        self.namespace = namespace
        self.kubectl = kubectl
        self.state_file = state_file
        self.handled: set[str] = set()
        if state_file is not None and state_file.exists():
            self.handled = set(state_file.read_text().split())
        self.lock = threading.Lock()

    def handle(self, decision: dict) -> str:
        decision_id, job, action = decision["decision_id"], decision.get("job_id") or "", decision["action"]
        with self.lock:
            if decision_id in self.handled:
                return "duplicate"
            if not _NAME.match(job.lower()):
                raise ValueError(f"decision {decision_id}: job id {job!r} is not a Kubernetes name")
            nodes = [n for n in decision.get("exclude_nodes") or [] if _NAME.match(n)]
            selector = f"{JOB_LABEL}={job}"
            if action in ("failover", "drain"):
                for node in nodes:
                    self.kubectl(["cordon", node], None)
            if action == "failover":
                restore = decision.get("restore") or {}
                data = {"decision_id": decision_id, "attempt": str((decision.get("attempt") or 0) + 1),
                        "tier": restore.get("tier") or "", "uri": restore.get("uri") or "",
                        "step": "" if restore.get("step") is None else str(restore["step"])}
                configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": f"{job.lower()}-faultlens-restore", "namespace": self.namespace,
                                          "labels": {JOB_LABEL: job}},
                             "data": data}
                self.kubectl(["apply", "-f", "-"], json.dumps(configmap))
                self.kubectl(["-n", self.namespace, "delete", "pods", "-l", selector, "--wait=false"], None)
            elif action == "escalate":
                reason = (decision.get("reason") or "")[:200]
                self.kubectl(["-n", self.namespace, "annotate", "pods", "-l", selector, "--overwrite",
                              f"faultlens.io/escalated={decision_id}: {reason}"], None)
            elif action != "drain":
                raise ValueError(f"decision {decision_id}: unknown action {action!r}")
            self.handled.add(decision_id)
            if self.state_file is not None:
                with self.state_file.open("a") as state:
                    state.write(decision_id + "\n")
            return "handled"


def make_server(receiver: DecisionReceiver, secret: str, host: str = "0.0.0.0", port: int = 8080,
                path: str = "/faultlens/decisions") -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != path:
                self._reply(404, "not found")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not verify_signature(secret, body, self.headers.get(SIGNATURE_HEADER)):
                self._reply(401, "bad signature")
                return
            try:
                decision = json.loads(body)
                outcome = receiver.handle(decision)
            except (ValueError, KeyError, TypeError) as exc:  # a malformed decision: permanent (4xx)
                self._reply(422, str(exc))
                return
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
                log.warning("decision %s: kubectl failed: %s", self.headers.get(DECISION_ID_HEADER), exc)
                self._reply(503, "kubectl failed; retry")  # faultlens retries 5xx with backoff
                return
            self._reply(200, outcome)

        def _reply(self, status: int, text: str) -> None:
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, fmt: str, *args: object) -> None:
            log.info("%s " + fmt, self.address_string(), *args)

    return ThreadingHTTPServer((host, port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    parser.add_argument("--state-file", type=Path, help="handled decision ids survive a restart here")
    args = parser.parse_args()
    secret = os.environ.get("FAULTLENS_WEBHOOK_SECRET")
    if not secret:
        parser.error("set FAULTLENS_WEBHOOK_SECRET (the webhook hook's secret)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = make_server(DecisionReceiver(args.namespace, state_file=args.state_file), secret, port=args.port)
    log.info("listening on :%d", args.port)
    server.serve_forever()


if __name__ == "__main__":
    main()
