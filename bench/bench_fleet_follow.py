"""The follower at fleet size on a real S3 API (issue 38): a pool of writer processes lands a
fleet's telemetry in real time into moto's S3 server on loopback, as the node agents and the ranks'
step timers write it; `faultlens attribute --follow`'s Follower polls in its own process; a
straggler, a crash and a hang are injected at known times.

    # the whole fleet's objects would be 2,048 nodes; this machine holds what --nodes says
    PYTHONPATH=. python -m bench.bench_fleet_follow --nodes 128 --duration 600
    PYTHONPATH=. python -m bench.bench_fleet_follow --nodes 16 --duration 150 --no-publish  # smoke

What lands, per node (8 ranks, 8 GPUs; `--ranks-per-node` to change):
* the node agent, every `--agent-flush` s (5, `faultlens collect --flush-age`'s default): a
  heartbeat a second of each rank and a GPU sample a second of each GPU, in one flush: a
  `heartbeats` and a `gpu_samples` segment and one landing-log key;
* each rank's step timer, every `--steps-flush` s (60: docs/scale-out.md's advice at this scale):
  its steps (one every `--step-s`, 5 s), a segment and a landing-log key each;
* the supervisor: a rank's exit (process_events, written through at once) and a new attempt's ranks.

Faults (seconds after the start; one writer owns each): a straggler (one rank's compute 1.6x from
`--straggler-at`), a crash (`--crash-at`: a rank SIGKILLed; attempt 1 starts 10 s later) and a
hang (`--hang-at`: every rank of attempt 1 stops completing steps).

Measured: per poll, the follower's requests as the server counts them (ListObjectsV2, GET, HEAD,
PUT, by the follower's access key), its CPU seconds and RSS; the lag of each incident from the
landing of the segment that carried it (the crash: from before its writer's flush, so the segment's
and its landing key's PUTs are inside the lag; the straggler and the hang: the follower's own
LagRecord, from the landing-log stamp of the newest segment of the job, and the time from the
injection). Side by side, in the same run, the list requests the partition listing (the follower's
listing before the landing log) needs for the same store at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import logging
import multiprocessing
import os
import resource
import socket
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import Figure, Section, emit, machine, write_section

JOB = "fleet"
BUCKET = "fleet"
WRITER_KEY, FOLLOWER_KEY = "writer", "follower"
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- moto's server, its own process


def _serve(port: int, ready: Any) -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    counts: dict[str, dict[str, int]] = {}
    app = server._server.app

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == "/__counts":
            who = environ.get("QUERY_STRING", "")
            body = json.dumps(counts.pop(who, {})).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        auth = environ.get("HTTP_AUTHORIZATION", "")
        who = auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth else "-"
        method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        kind = "list" if method == "GET" and "list-type=2" in query else method.lower()
        mine = counts.setdefault(who, {})
        mine[kind] = mine.get(kind, 0) + 1
        return app(environ, start_response)

    server._server.app = counting
    import boto3

    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="x",
                 aws_secret_access_key="x", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    ready.send("ready")
    ready.recv()
    server.stop()


def _counts(endpoint: str, who: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{endpoint}/__counts?{who}", timeout=60) as response:
        return json.loads(response.read())


def _location(endpoint: str, key: str, root: str) -> Any:
    from faultlens.collectors.store.layout import resolve_store

    return resolve_store(f"s3://{BUCKET}/{root}", endpoint_url=endpoint, key=key, secret=key,
                         skip_instance_cache=True)


# ---------------------------------------------------------------- the writers


def _node(n: int) -> str:
    return f"n{n:05d}"


def _writer(index: int, args: argparse.Namespace, endpoint: str, t0: float, out: Any) -> None:
    """Lands the telemetry of nodes index, index + writers, ... in real time until t0 +
    duration."""
    import numpy as np
    import pyarrow as pa

    from faultlens.collectors.store.sink import SegmentSink

    location = _location(endpoint, WRITER_KEY, args.root)
    sink = SegmentSink(location, flush_rows=10**9, flush_age_s=10**9, write_threads=1)
    per = args.ranks_per_node
    nodes = list(range(index, args.nodes, args.writers))
    ts_type = pa.timestamp("us", tz="UTC")
    crash_rank, slow_rank = 3, per * (args.nodes // 2) + 5
    restart_at = args.crash_at + 10.0
    # the next due time of each node's agent flush and each rank's steps flush (staggered)
    agent_due = {n: t0 + args.agent_flush * ((n * 7919) % 997) / 997 for n in nodes}
    steps_due = {(n, r): t0 + args.steps_flush * (((n * per + r) * 7919) % 997) / 997
                 for n in nodes for r in range(per)}
    steps_sent = {(n, r): 0 for n in nodes for r in range(per)}  # steps of the attempt written
    crash_sent = False
    ranks_sent: set[int] = set()
    stats = {"flushes": 0, "segments": 0, "flush_cpu_s": 0.0, "late_s": 0.0}

    def attempt_at(t: float) -> tuple[int, float]:
        """(attempt, its start) at wall time t."""
        return (1, t0 + restart_at) if t >= t0 + restart_at else (0, t0)

    def progress(t: float) -> tuple[int, float]:
        """(attempt, completed steps) at wall time t: none between the crash and the restart,
        none after the hang."""
        attempt, start = attempt_at(t)
        end = t
        if attempt == 0:
            end = min(t, t0 + args.crash_at)
        elif t0 + args.hang_at <= t:
            end = t0 + args.hang_at
        return attempt, max(0.0, (end - start) / args.step_s)

    def when(seconds: float) -> Any:
        return dt.datetime.fromtimestamp(seconds, dt.UTC)

    def ranks_rows(attempt: int, start: float) -> list[dict[str, Any]]:
        return [{"ts": when(start), "job_id": JOB, "attempt": attempt, "rank": n * per + r,
                 "local_rank": r, "node": _node(n), "world_size": args.nodes * per,
                 "local_world_size": per, "gpu_index": r, "pid": 1000 + r}
                for n in nodes for r in range(per)]

    while True:
        now = time.time()
        if now >= t0 + args.duration:
            break
        cpu0 = time.process_time()
        attempt, start = attempt_at(now)
        if attempt not in ranks_sent:
            sink.write("ranks", ranks_rows(attempt, start))
            sink.flush()
            ranks_sent.add(attempt)
            steps_sent = dict.fromkeys(steps_sent, 0)
        if not crash_sent and now >= t0 + args.crash_at and crash_rank // per in nodes:
            crash_sent = True
            before = time.time()
            sink.write("process_events", [{
                "ts": when(t0 + args.crash_at), "job_id": JOB, "attempt": 0, "rank": crash_rank,
                "local_rank": crash_rank % per, "node": _node(crash_rank // per), "kind": "exit",
                "exit_code": -9, "signal": "SIGKILL", "source": "supervisor"}])
            sink.flush()
            out.put(("crash", before, time.time()))
        for n in nodes:
            if now < agent_due[n]:
                continue
            stats["late_s"] = max(stats["late_s"], now - agent_due[n])
            agent_due[n] += args.agent_flush
            seconds = np.arange(args.agent_flush)[::-1]
            beat_ts = [when(now - s) for s in seconds for _ in range(per)]
            ranks = [n * per + r for _ in seconds for r in range(per)]
            beats_attempt, done = progress(now)
            step = int(done) - 1
            sink.write("heartbeats", _beats(pa, ts_type, beat_ts, ranks, n, beats_attempt, step,
                                            attempt_at(now)[1] + (step + 1) * args.step_s))
            sink.write("gpu_samples", pa.table({
                "ts": pa.array(beat_ts, ts_type), "node": [_node(n)] * len(ranks),
                "gpu_index": pa.array([r % per for r in ranks], pa.int32()),
                "temp_c": pa.array(np.full(len(ranks), 61.0), pa.float32()),
                "power_w": pa.array(np.full(len(ranks), 650.0), pa.float32()),
                "sm_clock_mhz": pa.array(np.full(len(ranks), 1980), pa.int32()),
                "gpu_util_pct": pa.array(np.full(len(ranks), 98.0), pa.float32())}))
            results = sink.flush()
            stats["flushes"] += 1
            stats["segments"] += sum(len(r.paths) for r in results)
        for (n, r), due in steps_due.items():
            if now < due:
                continue
            steps_due[(n, r)] += args.steps_flush
            step_attempt, done = progress(now)
            first, last = steps_sent[(n, r)], int(done)
            if last <= first:
                continue
            steps_sent[(n, r)] = last
            begin = attempt_at(now)[1]
            rank = n * per + r
            rows = []
            for step in range(first, last):
                slow = rank == slow_rank and begin + step * args.step_s >= t0 + args.straggler_at
                forward, backward = (0.9 * 1.6, 2.1 * 1.6) if slow else (0.9, 2.1)
                end = begin + (step + 1) * args.step_s
                rows.append({"ts": when(end), "job_id": JOB, "attempt": step_attempt,
                             "rank": rank, "local_rank": r, "node": _node(n), "step": step,
                             "phase": "train", "start_ts": when(end - args.step_s + 0.05),
                             "end_ts": when(end), "duration_s": args.step_s - 0.05,
                             "sections": {"forward": forward, "backward": backward,
                                          "comm": args.step_s - 0.05 - forward - backward}})
            sink.write("steps", rows)
            results = sink.flush()
            stats["flushes"] += 1
            stats["segments"] += sum(len(x.paths) for x in results)
        stats["flush_cpu_s"] += time.process_time() - cpu0
        time.sleep(max(0.0, min(0.2, min(agent_due.values()) - time.time())))
    stats["landing_keys"] = sink.landing_keys_written
    out.put(("writer", index, stats))


def _beats(pa: Any, ts_type: Any, beat_ts: list, ranks: list[int], n: int, attempt: int,
           step: int, step_end: float) -> Any:
    """A heartbeat a second of each rank: its last completed step, the next one in progress (a
    hung rank's stays the same)."""
    count = len(ranks)
    last = step if step >= 0 else None
    return pa.table({
        "ts": pa.array(beat_ts, ts_type), "job_id": [JOB] * count,
        "attempt": pa.array([attempt] * count, pa.int32()),
        "rank": pa.array(ranks, pa.int32()), "node": [_node(n)] * count,
        "step": pa.array([last] * count, pa.int64()),
        "step_ts": pa.array([dt.datetime.fromtimestamp(step_end, dt.UTC) if last is not None
                             else None] * count, ts_type),
        "steps": pa.array([step + 1] * count, pa.int64()),
        "current_step": pa.array([step + 1] * count, pa.int64()),
        "in_step": [True] * count, "phase": ["train"] * count, "closed": [False] * count,
    })


# ---------------------------------------------------------------- the follower


def _follower(args: argparse.Namespace, endpoint: str, t0: float, out: Any, path: str) -> None:
    from faultlens.attribution.engine import Engine
    from faultlens.attribution.follow import Follower
    from faultlens.collectors.sources.xid_catalog import load_xid_catalog

    location = _location(endpoint, FOLLOWER_KEY, args.root)
    follower = Follower(location, job=JOB, engine=Engine(catalog=load_xid_catalog()))
    page = os.sysconf("SC_PAGE_SIZE")
    polls = []
    incidents = []
    _counts(endpoint, FOLLOWER_KEY)
    with open(path, "w") as log:
        # at least --min-polls polls: a starved follower still shows what a poll costs
        while time.time() < t0 + args.duration + args.tail or len(polls) < args.min_polls:
            started, cpu0 = time.perf_counter(), time.process_time()
            written = follower.poll_once()
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - started
            with open("/proc/self/statm") as statm:
                rss = int(statm.read().split()[1]) * page / 2**20
            requests = _counts(endpoint, FOLLOWER_KEY)
            listing = follower.tail.listing
            record = {"t": round(time.time() - t0, 2), "wall_s": round(wall, 4),
                      "cpu_s": round(cpu, 4), "rss_mib": round(rss, 1),
                      "segments": follower.stats.segments_read, "keys": listing.keys_listed,
                      **{k: requests.get(k, 0) for k in ("list", "get", "head", "put")}}
            polls.append(record)
            log.write(json.dumps(record) + "\n")
            for incident in written:
                incidents.append({"class": incident.incident_class.value,
                                  "cause": str(incident.cause.value), "written": time.time(),
                                  "ranks": list(incident.culprit_ranks or ())})
            time.sleep(max(0.0, follower.config.poll_interval_s - wall))
    lags = [{"incident": r.incident_id, "segment": r.segment, "lag_s": r.lag_s}
            for r in follower.stats.lag]
    follower.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.put(("follower", {"incidents": incidents, "lags": lags, "max_rss_mib": peak}))


def _partition_listing_requests(endpoint: str, root: str) -> dict[str, int]:
    """The list requests one poll of the partition listing (the follower's before the landing log)
    costs on the store as it is at the end."""
    from faultlens.attribution.follow import TAILED_TABLES
    from faultlens.attribution.reading.tail import PartitionListing

    location = _location(endpoint, "partitions", root)
    listing = PartitionListing(location, JOB)
    today = dt.datetime.now(dt.UTC).date().isoformat()
    listing.refresh({table: today for table in TAILED_TABLES})  # learns the nodes
    _counts(endpoint, "partitions")
    listing.refresh({table: today for table in TAILED_TABLES})
    listed = sum(len(listing.segments(t)) for t in TAILED_TABLES)
    return {**_counts(endpoint, "partitions"), "segments": listed}


# ---------------------------------------------------------------- the run


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    parent, child = spawn.Pipe()
    server = spawn.Process(target=_serve, args=(port, child), daemon=True)
    server.start()
    parent.recv()
    out = spawn.Queue()
    t0 = time.time() + 3.0
    work = tempfile.mkdtemp(prefix="fleet-follow-")
    poll_log = f"{work}/polls.jsonl"
    writers = [spawn.Process(target=_writer, args=(i, args, endpoint, t0, out))
               for i in range(args.writers)]
    follower = spawn.Process(target=_follower, args=(args, endpoint, t0, out, poll_log))
    for process in (*writers, follower):
        process.start()
    messages: dict[str, Any] = {"writers": []}
    while len(messages["writers"]) < args.writers or "follower" not in messages:
        kind, *rest = out.get(timeout=args.duration + args.tail + 600)
        if kind == "writer":
            messages["writers"].append(rest[1])
        else:
            messages[kind] = rest if kind == "crash" else rest[0]
    for process in (*writers, follower):
        process.join(timeout=60)
    writer_requests = _counts(endpoint, WRITER_KEY)
    partitions = _partition_listing_requests(endpoint, args.root)
    parent.send("done")
    server.join(timeout=30)
    with open(poll_log) as handle:
        polls = [json.loads(line) for line in handle]
    return _summary(args, t0, polls, messages, writer_requests, partitions)


def _summary(args: argparse.Namespace, t0: float, polls: list[dict[str, Any]],
             messages: dict[str, Any], writer_requests: dict[str, int],
             partitions: dict[str, int]) -> dict[str, Any]:
    follow = messages["follower"]
    steady = [p for p in polls[1:] if p["t"] >= 0] or polls[-1:]  # after the catch-up
    half = len(steady) // 2
    if not steady:
        raise SystemExit("the follower made no poll: the machine is too loaded for this run")
    first_rss = [p["rss_mib"] for p in steady[: max(1, len(steady) // 10)]]
    mid_rss = [p["rss_mib"] for p in steady[half: half + max(1, len(steady) // 10)]]
    last_rss = [p["rss_mib"] for p in steady[-max(1, len(steady) // 10):]]
    lags: dict[str, Any] = {}
    by_class: dict[str, dict[str, Any]] = {}
    for incident in follow["incidents"]:
        by_class.setdefault(incident["class"], incident)
    if "crash" in by_class and "crash" in messages:
        before, after = messages["crash"]
        lags["crash"] = {"from_flush_start_s": round(by_class["crash"]["written"] - before, 3),
                         "from_landed_s": round(by_class["crash"]["written"] - after, 3)}
    for name, at in (("straggler", args.straggler_at), ("collective_hang", args.hang_at)):
        if name in by_class:
            lags[name] = {"from_injection_s": round(by_class[name]["written"] - t0 - at, 1)}
    follower_lags = [r["lag_s"] for r in follow["lags"] if r["lag_s"] is not None]
    writers = messages["writers"]
    seconds = args.duration
    per_node_flush = args.agent_flush
    objects = writer_requests.get("put", 0)
    full = args.nodes_fleet
    per_node_puts = 3 / args.agent_flush + 2 * args.ranks_per_node / args.steps_flush
    return {
        "nodes": args.nodes, "ranks": args.nodes * args.ranks_per_node, "duration_s": seconds,
        "writers": args.writers, "agent_flush_s": per_node_flush, "steps_flush_s": args.steps_flush,
        "writer_puts_per_s": round(objects / seconds, 1),
        # what 2,048 nodes land at these flush intervals (an agent flush: 2 segments + 1 key; a
        # rank's steps flush: 1 + 1), beside what this run's writers achieved
        "fleet_puts_per_s_same_rates": round(full * per_node_puts),
        "puts_per_s_designed": round(args.nodes * per_node_puts, 1),
        "writer_segments": sum(w["segments"] for w in writers),
        "writer_landing_keys": sum(w["landing_keys"] for w in writers),
        "writer_late_s_max": round(max(w["late_s"] for w in writers), 2),
        "writer_cpu_s": round(sum(w["flush_cpu_s"] for w in writers), 1),
        "polls": len(steady),
        "poll_interval_s_median": round(statistics.median(
            [b["t"] - a["t"] for a, b in itertools.pairwise(steady)]), 3)
        if len(steady) > 2 else None,
        "per_poll": {
            key: {"p50": _pct([p[key] for p in steady], 0.5),
                  "p95": _pct([p[key] for p in steady], 0.95),
                  "max": max((p[key] for p in steady), default=None)}
            for key in ("list", "get", "head", "put", "keys", "cpu_s", "wall_s")
        },
        "segments_read": steady[-1]["segments"] if steady else 0,
        "follower_cpu_s": round(sum(p["cpu_s"] for p in steady), 1),
        "rss_mib": {"first_tenth": round(statistics.median(first_rss), 1),
                    "middle": round(statistics.median(mid_rss), 1),
                    "last_tenth": round(statistics.median(last_rss), 1),
                    "max": round(follow["max_rss_mib"], 1)},
        "incidents": [{k: v for k, v in i.items() if k != "written"}
                      | {"at_s": round(i["written"] - t0, 1)} for i in follow["incidents"]],
        "lag": lags,
        "follower_lag_s": {"p50": round(_pct(follower_lags, 0.5), 3),
                           "p95": round(_pct(follower_lags, 0.95), 3),
                           "n": len(follower_lags)} if follower_lags else None,
        "follower_own_lags": [{**r, "incident": r["incident"][:12]} for r in follow["lags"]],
        "partition_listing_poll": partitions,
        "load": os.getloadavg(),
        "machine": machine(),
    }


def _section(result: dict[str, Any], command: str) -> Section:
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    commit = os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip() or "-"
    per = result["per_poll"]
    rss = result["rss_mib"]
    lag = result["lag"]

    def figure(name: str, value: str, target: str = "-", anchor: str = "-",
               ratio: str = "-") -> Figure:
        return Figure(name, value, target, anchor, ratio, commit, date)

    crash = lag.get("crash", {})
    partition_lists = result["partition_listing_poll"].get("list", 0)
    listing_ratio = (result["partition_listing_poll"].get("list", 0) / max(per["list"]["p95"], 1))
    return Section(
        "The fleet follower on S3 (moto): lag, requests, CPU and memory per poll",
        "Compares: the follower listing the landing log vs the partition listing it used before "
        "(same store, same run), on moto's S3 server on loopback.",
        (command,),
        (
            figure("crash: segment flush start -> incident row (s)",
                   f"{crash.get('from_flush_start_s', 'not found')}", "<= 2 s"),
            figure("follower's own lag, every incident, p50 / p95 (s)",
                   f"{(result['follower_lag_s'] or {}).get('p50')} / "
                   f"{(result['follower_lag_s'] or {}).get('p95')}", "p95 <= 2 s"),
            figure("straggler / hang: injection -> incident row (s)",
                   f"{lag.get('straggler', {}).get('from_injection_s', 'not found')} / "
                   f"{lag.get('collective_hang', {}).get('from_injection_s', 'not found')}"),
            figure("list requests per poll, p50 / p95 / max",
                   f"{per['list']['p50']} / {per['list']['p95']} / {per['list']['max']}",
                   "bounded by what landed",
                   f"partition listing, one poll at the end: {partition_lists}",
                   f"{listing_ratio:.1f}x"),
            figure("GET / HEAD per poll, p50 / p95 (one GET per new segment)",
                   f"{per['get']['p50']} / {per['get']['p95']}; HEAD {per['head']['max']}"),
            figure("CPU s per poll, p50 / p95", f"{per['cpu_s']['p50']} / {per['cpu_s']['p95']}"),
            figure("RSS MiB: first tenth / middle / last tenth of the run",
                   f"{rss['first_tenth']} / {rss['middle']} / {rss['last_tenth']}", "flat"),
            figure("PUTs per s landed by the writers (designed at these nodes; at 2,048 nodes)",
                   f"{result['writer_puts_per_s']} ({result.get('puts_per_s_designed', '-')}; "
                   f"{result['fleet_puts_per_s_same_rates']:,.0f})"),
        ),
        (
            f"{result['nodes']:,} nodes x {result['ranks'] // result['nodes']} ranks "
            f"({result['ranks']:,} ranks) for {result['duration_s']} s in real time, "
            f"{result['writers']} writer process(es): what this 2-core machine held beside moto "
            "and the follower, not the 2,048 nodes; the per-poll figures follow the landings "
            "per poll, so at 2,048 nodes they scale with the object rate in brackets.",
            f"Agent flush every {result['agent_flush_s']} s, steps flush every "
            f"{result['steps_flush_s']} s; writers at most {result['writer_late_s_max']} s behind "
            "their schedule.",
            f"Load average at the end {result['load'][0]:.0f} (the shared 2-core machine).",
        ),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--nodes-fleet", type=int, default=2048)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--tail", type=float, default=20.0, help="polls after the writers stop")
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--min-polls", type=int, default=5)
    parser.add_argument("--agent-flush", type=int, default=5)
    parser.add_argument("--steps-flush", type=float, default=60.0)
    parser.add_argument("--step-s", type=float, default=5.0)
    parser.add_argument("--straggler-at", type=float, default=30.0)
    parser.add_argument("--crash-at", type=float, default=None,
                        help="default: 45%% of the duration")
    parser.add_argument("--hang-at", type=float, default=None, help="default: 80%% of it")
    parser.add_argument("--root", default=f"store-{os.getpid()}")
    parser.add_argument("--no-publish", action="store_true")
    args = parser.parse_args(argv)
    args.crash_at = args.crash_at if args.crash_at is not None else 0.45 * args.duration
    args.hang_at = args.hang_at if args.hang_at is not None else 0.8 * args.duration
    result = run(args)
    emit("fleet_follow", result)
    if not args.no_publish:
        command = ("PYTHONPATH=. python -m bench.bench_fleet_follow --nodes "
                   f"{args.nodes} --duration {args.duration:g} --writers {args.writers}")
        write_section(DOC, _section(result, command))


if __name__ == "__main__":
    main()
