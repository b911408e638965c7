"""Decision latency, incident -> decision persisted -> delivered to a webhook on 127.0.0.1, side by
side with the alternative a user would write first: POST the decision without persisting it (fast,
but a crash or an unreachable controller loses it). The difference is the price of the at-least-once
guarantee.

    PYTHONPATH=. python bench/bench_decision_delivery.py [--decisions 50]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.common import emit, machine
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, load_policy
from faultlens.controller.delivery import Deliverer
from faultlens.controller.hooks import RetryPolicy, WebhookHook, sign


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _incident(n: int) -> Incident:
    now = dt.datetime.now(dt.UTC)
    return Incident(
        f"inc-bench-{n}",
        IncidentClass.CRASH,
        Cause.GPU_HARDWARE,
        now,
        now,
        0.95,
        "xid-79",
        "bench",
        job_id="bench",
        attempt=0,
        culprit_nodes=(f"node-{n % 8}",),
        culprit_ranks=(n,),
        evidence=(Evidence("gpu_events", now, "Xid 79"),),
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decisions", type=int, default=50)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    policy = DecisionPolicy(load_policy())
    results = {}
    with tempfile.TemporaryDirectory() as store:
        deliverer = Deliverer(
            store, [WebhookHook(url, secret="bench", retry=RetryPolicy(attempts=1))]
        )
        durable = []
        for n in range(args.decisions):
            start = time.perf_counter()
            deliverer.submit(policy.decide(_incident(n)))
            durable.append(time.perf_counter() - start)
        deliverer.close()
    plain = []
    for n in range(args.decisions):
        start = time.perf_counter()
        body = policy.decide(_incident(10_000 + n)).to_json().encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "X-Faultlens-Signature": sign("bench", body)})
        urllib.request.urlopen(request, timeout=10).read()
        plain.append(time.perf_counter() - start)
    server.shutdown()
    for name, values in (
        ("faultlens_persist_then_deliver", durable),
        ("post_without_persisting", plain),
    ):
        results[name] = {"p50_ms": round(statistics.median(values) * 1000, 2),
                         "p95_ms": round(_pct(values, 0.95) * 1000, 2)}
    emit(
        "decision_delivery", {"decisions": args.decisions, "results": results, "machine": machine()}
    )


if __name__ == "__main__":
    main()
