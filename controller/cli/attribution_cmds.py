"""`faultlens attribute` (batch or --follow) and `faultlens incidents`.

The CLI is the edge where collectors and attribution meet: in follow mode a suspected hang can
request flight-recorder dumps from the running job (touching the trigger file its ranks poll, or
SIGUSR1 to the rank processes of this host, interface 4), read them with the flight-recorder reader,
store them in the collectives table and hand them to the hang analysis.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pyarrow as pa

from faultlens.attribution.detectors.progress import HangSuspect
from faultlens.attribution.engine import Engine, attribute, write_new_incidents
from faultlens.attribution.follow import Follower
from faultlens.attribution.incident import Incident
from faultlens.attribution.reading.queries import incident_table
from faultlens.attribution.reading.store import Store
from faultlens.attribution.rules import load_crash_rules, load_thresholds
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.common import CliError, add_format_args, add_store_arg, emit

INCIDENT_COLUMNS = (
    "detected_ts",
    "incident_id",
    "job_id",
    "attempt",
    "class",
    "cause",
    "culprit_nodes",
    "culprit_ranks",
    "culprit_gpus",
    "confidence",
    "rule",
    "summary",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser("attribute", help="attribute crashes, hangs and stragglers (batch, "
                                                  "or --follow)")
    add_store_arg(run)
    add_format_args(run)
    run.add_argument("--job", help="only this job")
    run.add_argument("--follow", action="store_true", help="keep tailing new segments and "
                                                           "attribute live")
    run.add_argument("--interval", type=float, default=None,
                     help="seconds between store listings in --follow (default: "
                          "rules/thresholds.yaml)")
    run.add_argument("--now", help="batch: the time of the pass (ISO 8601); default: each job up "
                                   "to its newest "
                                   "telemetry (a replay)")
    run.add_argument("--dry-run", action="store_true", help="batch: show incidents, write nothing")
    run.add_argument("--rules", type=Path, metavar="FILE_OR_DIR",
                     help="crash rules file (default rules/crash.yaml), or a directory of rule "
                          "files replacing the "
                          "shipped ones of the same name (default $FAULTLENS_RULES)")
    run.add_argument("--thresholds", type=Path, help="thresholds file (default "
                                                     "rules/thresholds.yaml)")
    run.add_argument("--xid-catalog", type=Path, help="XID catalog (default "
                                                      "$FAULTLENS_XID_CATALOG, else "
                                                      "rules/xid.yaml)")
    run.add_argument("--fr-dump-dir", type=Path,
                     help="--follow: where the job's ranks write flight-recorder dumps "
                          "(FAULTLENS_FR_DIR)")
    run.add_argument("--fr-trigger", type=Path,
                     help="--follow: the trigger file the ranks poll (FAULTLENS_FR_TRIGGER); "
                          "touched on a hang")
    run.add_argument("--fr-signal", action="store_true",
                     help="--follow: on a hang, send SIGUSR1 to this host's rank processes (pids "
                          "from ranks)")
    run.add_argument("--fr-wait", type=float, default=10.0, help="seconds to wait for requested "
                                                                 "dumps")
    run.add_argument("--max-polls", type=int, help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_attribute)

    show = subparsers.add_parser("incidents", help="list the incidents in the store")
    add_store_arg(show)
    add_format_args(show)
    show.add_argument("--job", help="only this job")
    show.set_defaults(func=cmd_incidents)


def _engine(args: argparse.Namespace, store_url: str | None = None) -> Engine:
    crash_rules = load_crash_rules(args.rules)
    thresholds = load_thresholds(args.thresholds)
    requester = None
    if args.follow and (args.fr_trigger or args.fr_signal):
        if args.fr_dump_dir is None:
            raise CliError("--fr-trigger/--fr-signal need --fr-dump-dir (where the ranks write "
                           "their dumps)")
        requester = DumpRequester(
            store_url or args.store,
            args.fr_dump_dir,
            trigger=args.fr_trigger,
            use_signal=args.fr_signal,
            wait_s=args.fr_wait,
        )
    try:
        catalog = load_xid_catalog(args.xid_catalog) if getattr(args, "xid_catalog", None) else None
        return Engine(
            crash_rules=crash_rules,
            thresholds=thresholds,
            dump_requester=requester,
            catalog=catalog,
        )
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot load the XID catalog: {exc}") from None


def _rows(incidents: list[Incident], written: set[str] | None = None) -> list[dict]:
    rows = []
    for incident in incidents:
        row = {k: v for k, v in incident.to_row().items() if k in INCIDENT_COLUMNS}
        ordered = {k: row.get(k) for k in INCIDENT_COLUMNS}
        if written is not None:
            ordered["new"] = incident.incident_id in written
        rows.append(ordered)
    return rows


def cmd_attribute(args: argparse.Namespace) -> int:
    if args.follow:
        return _follow(args)
    now = None
    if args.now:
        try:
            now = dt.datetime.fromisoformat(args.now)
        except ValueError:
            raise CliError(f"--now {args.now!r}: expected an ISO 8601 time, e.g. "
                           "2026-11-30T12:00:00+00:00") from None
        now = now if now.tzinfo else now.replace(tzinfo=dt.UTC)
    engine = _engine(args)
    from faultlens.controller.cli.progress import progress

    with (
        Store(args.store, jobs=[args.job] if args.job else None) as store,
        progress("attributing " + (f"job {args.job}" if args.job else "every job in the store")),
    ):
        incidents = attribute(store, args.job, now, engine=engine)
    written = (
        set()
        if args.dry_run
        else {i.incident_id for i in write_new_incidents(args.store, incidents)}
    )
    emit(_rows(incidents, written), args.fmt, title=f"{len(incidents)} incident(s), {len(written)} "
                                                    "new")
    return 0


def _follow(args: argparse.Namespace) -> int:
    engine = _engine(args, args.store)
    follower = Follower(args.store, job=args.job, engine=engine)
    print(
        f"faultlens attribute: following {args.store}"
        + (f" (job {args.job})" if args.job else "")
        + "; Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )

    def show(incident: Incident) -> None:
        if args.fmt == "json":
            emit(_rows([incident]), "json")
        else:
            print(
                f"{incident.detected_ts.isoformat()} {incident.incident_id} {incident.summary}",
                flush=True,
            )
        sys.stdout.flush()

    try:
        follower.run(interval=args.interval, on_incident=show, max_polls=args.max_polls)
    finally:
        follower.close()
    return 0


def cmd_incidents(args: argparse.Namespace) -> int:
    with Store(args.store) as store:
        table = incident_table(store, job=args.job or None)
    columns = list(INCIDENT_COLUMNS) + (["evidence", "first_signal_ts", "step", "fingerprint"]
                                        if args.fmt != "table" else [])
    emit(table.select([c for c in columns if c in table.column_names]), args.fmt,
         title=f"{table.num_rows} incident(s) in {args.store}")
    return 0


class DumpRequester:
    """Asks a running job for flight-recorder dumps (interface 4) and reads them: touches the
    trigger file and/or sends SIGUSR1 to this host's rank processes, waits for a dump per expected
    rank newer than the request, reads the directory with the flight-recorder reader, stores the
    rows in the collectives table, returns them."""

    def __init__(
        self,
        store: str,
        dump_dir: Path,
        *,
        trigger: Path | None = None,
        use_signal: bool = False,
        wait_s: float = 10.0,
        host: str | None = None,
    ) -> None:
        self.store = store
        self.dump_dir = dump_dir
        self.trigger = trigger
        self.use_signal = use_signal
        self.wait_s = wait_s
        self.host = host or socket.gethostname()

    def _pids(self, suspect: HangSuspect) -> dict[int, int]:
        with Store(self.store, jobs=[suspect.job_id] if suspect.job_id else None) as store:
            rows = store.query("SELECT rank, pid, hostname, node FROM ranks WHERE job_id = ? AND "
                               "attempt = ?",
                               [suspect.job_id, suspect.attempt]).to_pylist()
        return {
            r["rank"]: r["pid"]
            for r in rows
            if r["pid"] and self.host in (r["hostname"], r["node"])
        }

    def __call__(self, suspect: HangSuspect) -> pa.Table | None:
        from faultlens.collectors.artifacts.flight_recorder import DumpDirError, read_dump_dir
        from faultlens.collectors.sources.source import NodeIdentity

        requested = time.time()
        expected: set[int] = set()
        if self.trigger is not None:
            self.trigger.parent.mkdir(parents=True, exist_ok=True)
            self.trigger.touch()
            os.utime(self.trigger, None)
        if self.use_signal:
            pids = self._pids(suspect)
            expected = set(pids)
            for pid in pids.values():
                try:
                    os.kill(pid, signal.SIGUSR1)
                except (ProcessLookupError, PermissionError):
                    expected.discard(next(r for r, p in pids.items() if p == pid))
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            fresh = {
                p for p in self.dump_dir.glob("rank_*.pkl") if p.stat().st_mtime >= requested - 0.5
            }
            if fresh and (not expected or len(fresh) >= len(expected)):
                time.sleep(0.3)  # the other ranks' dumps land within moments of each other
                break
            time.sleep(0.1)
        try:
            dumps = read_dump_dir(
                self.dump_dir,
                identity=NodeIdentity(
                    node=self.host, job_id=suspect.job_id, attempt=suspect.attempt
                ),
            )
        except DumpDirError:
            return None
        if dumps.table.num_rows:
            with SegmentSink(self.store, flush_rows=10_000_000, flush_age_s=3600) as sink:
                sink.write("collectives", dumps.table)
        return dumps.table
