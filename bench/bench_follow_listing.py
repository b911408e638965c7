"""Follower listing per poll (issue 14): what a job's follower lists on each poll of an S3 store,
before (every tailed table listed whole, pruned afterwards: list_segments, as Store.refresh did for
the tail) and now (attribution/reading/tail.py PartitionListing: the job's own partitions and its
nodes' node-level ones, from the window's oldest date on), side by side in one run, on moto's S3
server.

    # 2,048 nodes: one job over 2 days; a 30-day store
    python -m bench.bench_follow_listing
    python -m bench.bench_follow_listing --nodes 256 --polls 2  # smaller

Two stores of 2,048 nodes' worth of segments (one tiny segment per partition, as a compacted store
holds):

* `one job, 2 days`: the followed job on every node for two days (steps, ranks, the GPU samples and
  a few GPU events of its nodes). Nothing in it is not the follower's: what is left to cut is
  yesterday's partitions.
* `30 days, 7 jobs`: the followed job on half the nodes for the last two days, another job on the
  other half for the last five, five earlier jobs on every node over the 25 days before (steps,
  ranks, an exit event per node at each job's end), every node's GPU samples every day and a GPU
  event on one node-day in 16.

moto's server runs in its own process (so that its CPU is not the client's), seeded in that process
straight into its backend (its HTTP PUTs would take ~10 ms each); every listing measured goes over
HTTP, and the server counts the requests it receives (ListObjectsV2, HEAD, GET). Wall seconds are
moto's: each of its list requests sorts every key under the prefix, so its cost grows with the keys
under a prefix, not only with the keys returned (S3 answers a page in roughly constant time); the
request counts are the figure that carries over to S3.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import logging
import multiprocessing
import socket
import statistics
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from bench.common import emit, machine

TABLES = (
    "ranks",
    "steps",
    "process_events",
    "gpu_events",
    "gpu_samples",
    "collectives",
    "heartbeats",
)
LAST_DAY = dt.date(2026, 11, 30)
RETAIN_S = 3600.0  # rules/thresholds.yaml engine.retain_s


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    days: int
    # the followed job on nodes [0, job_nodes) for the last two days (or all days if days <= 2)
    job_nodes: int
    other_live: bool  # another job on the other nodes for the last five days
    earlier_jobs: int  # jobs on every node before, each over an equal share of the remaining days


def _days(scenario: Scenario) -> list[str]:
    return [
        (LAST_DAY - dt.timedelta(days=scenario.days - 1 - i)).isoformat()
        for i in range(scenario.days)
    ]


def layout(scenario: Scenario) -> tuple[list[tuple[str, str]], dict[str, str | None]]:
    """(table, key below the store root) of every segment, and the window start date per table of
    the follower of `train` (retain_s behind the newest row it holds of that table; None when it
    holds none)."""
    days = _days(scenario)
    keys: list[tuple[str, str]] = []
    newest: dict[str, str] = {}

    def put(table: str, job: str, day: str, node: int, followed: bool) -> None:
        keys.append((table, f"{table}/job={job}/date={day}/node=node-{node:04d}/"
                            f"{len(keys):020d}-{node:04x}{len(keys) % 65536:04x}cafe.parquet"))
        if followed:
            newest[table] = max(newest.get(table, ""), day)

    job_days = days[-2:]
    for i, day in enumerate(job_days):
        for node in range(scenario.job_nodes):
            put("steps", "train", day, node, True)
            if i == 0:
                put("ranks", "train", day, node, True)
    if scenario.other_live:
        for i, day in enumerate(days[-5:]):
            for node in range(scenario.job_nodes, scenario.nodes):
                put("steps", "other", day, node, False)
                if i == 0:
                    put("ranks", "other", day, node, False)
    earlier = days[:-5] if scenario.other_live else []
    if scenario.earlier_jobs and earlier:
        share = max(1, len(earlier) // scenario.earlier_jobs)
        for j in range(scenario.earlier_jobs):
            span = earlier[j * share:(j + 1) * share]
            for i, day in enumerate(span):
                for node in range(scenario.nodes):
                    put("steps", f"old-{j:02d}", day, node, False)
                    if i == 0:
                        put("ranks", f"old-{j:02d}", day, node, False)
                    if i == len(span) - 1:
                        put("process_events", f"old-{j:02d}", day, node, False)
    for d, day in enumerate(days):
        for node in range(scenario.nodes):
            put("gpu_samples", "_node", day, node, node < scenario.job_nodes)
            if (node + d) % 16 == 0:
                put("gpu_events", "_node", day, node, node < scenario.job_nodes)
    since = {}
    for table in TABLES:
        if table not in newest:
            since[table] = None
            continue
        noon = dt.datetime.fromisoformat(newest[table]).replace(hour=12, tzinfo=dt.UTC)
        since[table] = (noon - dt.timedelta(seconds=RETAIN_S)).date().isoformat()
    return keys, since


# ---------------------------------------------------------------- moto's server, in its own process


def _payloads() -> dict[str, bytes]:
    """One tiny valid segment per table (every key of a table holds the same bytes: only listings
    are measured).
    """
    import pyarrow as pa

    from faultlens.collectors.store.layout import write_parquet
    from faultlens.collectors.store.schema import validate

    out = {}
    for table in TABLES:
        rows = validate(
            table,
            pa.table(
                {
                    "ts": pa.array(
                        [dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")
                    ),
                    "node": ["node-0000"],
                }
            ),
        )
        buffer = io.BytesIO()
        write_parquet(rows, buffer)
        out[table] = buffer.getvalue()
    return out


def _serve(port: int, stores: dict[str, Scenario], ready: Any) -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    from moto.backends import get_backend
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    backend = get_backend("s3")[DEFAULT_ACCOUNT_ID]["aws"]
    payloads = _payloads()
    seeded = {}
    # a bucket each: moto scans a bucket's every key on each listing
    for root, scenario in stores.items():
        backend.create_bucket(_bucket(root), "us-east-1")
        keys, _ = layout(scenario)
        for table, key in keys:
            backend.put_object(_bucket(root), f"store/{key}", payloads[table])
        seeded[root] = len(keys)
    counts: dict[str, int] = {}
    app = server._server.app

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == "/__counts":
            body = json.dumps(counts).encode()
            counts.clear()
            start_response(
                "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            )
            return [body]
        method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        kind = "list" if method == "GET" and "list-type=2" in query else method.lower()
        counts[kind] = counts.get(kind, 0) + 1
        return app(environ, start_response)

    server._server.app = counting
    ready.send(seeded)
    ready.recv()  # until the client is done
    server.stop()


def _bucket(root: str) -> str:
    return f"bench-follow-{root}"


def _counts(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{endpoint}/__counts", timeout=60) as response:
        return json.loads(response.read())


# ---------------------------------------------------------------- the client: one scenario


def _measure(
    endpoint: str, root: str, scenario: Scenario, polls: int, before_polls: int
) -> dict[str, Any]:
    from faultlens.attribution.reading.tail import PartitionListing
    from faultlens.collectors.store.layout import list_segments, resolve_store

    options = {
        "endpoint_url": endpoint,
        "key": "bench",
        "secret": "bench",
        "skip_instance_cache": True,
    }
    location = resolve_store(f"s3://{_bucket(root)}/store", **options)
    keys, since = layout(scenario)

    def before() -> int:
        return sum(len(list_segments(location, table, jobs=["train", "_node"])) for table in TABLES)

    listing = PartitionListing(location, "train")

    def after() -> int:
        listing.refresh(since)
        return sum(len(listing.segments(table)) for table in TABLES)

    _counts(endpoint)
    first = time.perf_counter()
    # the follower's first poll: its window is empty
    listing.refresh({table: None for table in TABLES})
    first_s = time.perf_counter() - first
    first_counts = _counts(endpoint)
    rows = {}
    for label, poll, n in (("before", before, before_polls), ("after", after, polls)):
        walls, requests, segments = [], [], 0
        for _ in range(n):
            _counts(endpoint)
            started = time.perf_counter()
            segments = poll()
            walls.append(time.perf_counter() - started)
            requests.append(_counts(endpoint))
        rows[label] = {
            "polls": n,
            "wall_s": [round(w, 3) for w in walls],
            "wall_s_median": round(statistics.median(walls), 3),
            "list_requests": [r.get("list", 0) for r in requests],
            "head_requests": [r.get("head", 0) for r in requests],
            "get_requests": [r.get("get", 0) for r in requests],
            "segments_listed": segments,
        }
    return {
        "scenario": scenario.name,
        "nodes": scenario.nodes,
        "days": scenario.days,
        "jobs": 1 + int(scenario.other_live) + scenario.earlier_jobs,
        "followed_job_nodes": scenario.job_nodes,
        "segments_in_store": len(keys),
        "window_start": since,
        "after_first_poll": {
            "wall_s": round(first_s, 3),
            "list_requests": first_counts.get("list", 0),
        },
        **rows,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _table(results: list[dict[str, Any]]) -> str:
    lines = ["| store | segments | follower | list requests / poll | HEAD / poll | wall s / poll "
             "(moto) | "
             "segments handed to the tail |", "|---|---|---|---|---|---|---|"]
    for result in results:
        name = f"{result['scenario']} ({result['nodes']:,} nodes)"
        for label, text in (("before", "today: every table whole"), ("after", "job partitions, "
                                                                              "window dates")):
            row = result[label]
            lines.append(f"| {name} | {result['segments_in_store']:,} | {text} | "
                         f"{row['list_requests'][-1]:,} | "
                         f"{row['head_requests'][-1]} | {row['wall_s_median']} | "
                         f"{row['segments_listed']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--days", type=int, default=30, help="days of the larger store")
    parser.add_argument("--earlier-jobs", type=int, default=5)
    parser.add_argument("--polls", type=int, default=3, help="polls measured with the new listing")
    parser.add_argument("--before-polls", type=int, default=1,
                        help="polls measured with the full listing (~200 s each for the 30-day "
                             "store on moto)")
    parser.add_argument("--only", choices=("plain", "store"), help="one of the two stores")
    args = parser.parse_args(argv)
    scenarios = {
        "plain": Scenario("one job, 2 days", args.nodes, 2, args.nodes, False, 0),
        "store": Scenario(f"{args.days} days, {2 + args.earlier_jobs} jobs", args.nodes, args.days,
                          args.nodes // 2, True, args.earlier_jobs),
    }
    chosen = {key: s for key, s in scenarios.items() if args.only in (None, key)}
    port = _free_port()
    parent, child = multiprocessing.get_context("spawn").Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, chosen, child), daemon=True
    )
    started = time.perf_counter()
    server.start()
    seeded = parent.recv()
    seed_s = time.perf_counter() - started
    endpoint = f"http://127.0.0.1:{port}"
    try:
        results = [_measure(endpoint, root, scenario, args.polls, args.before_polls)
                   for root, scenario in chosen.items()]
    finally:
        parent.send("done")
        server.join(timeout=30)
    emit("follow_listing", {"runs": results, "seeded_segments": seeded, "seed_s": round(seed_s, 1),
                            "machine": machine()})
    print()
    print(_table(results))


if __name__ == "__main__":
    main()
