"""Decision commands: decisions (list), decide (policy over new incidents), deliver (redelivery
pass), checkpoints (the catalog and the restore it would choose)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from faultlens import environment
from faultlens.attribution.decision import Decision
from faultlens.attribution.incident import Incident
from faultlens.attribution.policy import DecisionPolicy, StoreHistory, load_policy
from faultlens.attribution.reading.queries import decided_incident_ids, incident_rows
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.layout import StoreError
from faultlens.controller.checkpoints import CheckpointCatalog, parse_tiers
from faultlens.controller.cli.common import (
    CliError,
    add_format_args,
    add_rules_dir_arg,
    add_store_arg,
    emit,
)
from faultlens.controller.delivery import DecisionLog, Deliverer
from faultlens.controller.hooks import hooks_from_config, load_hooks


def register(subparsers: argparse._SubParsersAction) -> None:
    decisions = subparsers.add_parser(
        "decisions", help="decisions in the store with their latest delivery status"
    )
    add_store_arg(decisions)
    add_format_args(decisions)
    decisions.add_argument("--job", help="only this job")
    decisions.set_defaults(func=cmd_decisions)

    decide = subparsers.add_parser(
        "decide",
        help="apply the decision policy to incidents that "
        "have no decision "
        "yet; persist the decisions and deliver them to "
        "the hooks",
    )
    add_store_arg(decide)
    add_format_args(decide)
    decide.add_argument("--job", help="only this job's incidents")
    decide.add_argument(
        "--policy", help="policy file (default policy.yaml of --rules DIR, else rules/policy.yaml)"
    )
    add_rules_dir_arg(decide)
    decide.add_argument(
        "--hooks",
        help="hooks YAML file; without hooks decisions are persisted, "
        "delivered later "
        "by `faultlens deliver`",
    )
    _add_hook_args(decide)
    decide.add_argument(
        "--tiers",
        nargs="+",
        metavar="TIER",
        help="checkpoint tiers for the restore choice: a YAML file or KIND[@NODE]=URL ...",
    )
    decide.set_defaults(func=cmd_decide)

    deliver = subparsers.add_parser(
        "deliver", help="redeliver pending or failed decisions to the hooks"
    )
    add_store_arg(deliver)
    add_format_args(deliver)
    deliver.add_argument("--hooks", help="hooks YAML file")
    _add_hook_args(deliver)
    deliver.set_defaults(func=cmd_deliver)

    checkpoints = subparsers.add_parser(
        "checkpoints", help="checkpoints in each tier and the restore that would be chosen"
    )
    add_format_args(checkpoints)
    checkpoints.add_argument(
        "--tiers",
        nargs="+",
        required=True,
        metavar="TIER",
        help="a tiers YAML file, or KIND[@NODE]=URL (local@node-0=/nvme/ckpt, durable=s3://b/j)",
    )
    checkpoints.add_argument(
        "--exclude", action="append", default=[], metavar="NODE", help="node leaving the job"
    )
    checkpoints.add_argument(
        "--before-step", type=int, help="only checkpoints older than this step (corruption)"
    )
    checkpoints.add_argument(
        "--before", help="only checkpoints written before this ISO time (corruption)"
    )
    checkpoints.add_argument("--world-size", type=int, help="ranks the restore must cover")
    checkpoints.add_argument(
        "--verify", action="store_true", help="verify every checksum, not just the chosen"
    )
    checkpoints.add_argument(
        "--record", action="store_true", help="write the catalog to the checkpoints table"
    )
    checkpoints.add_argument("--job", help="job id for recorded rows")
    add_store_arg(checkpoints)
    checkpoints.set_defaults(func=cmd_checkpoints)


def _add_hook_args(parser: argparse.ArgumentParser) -> None:
    """Hooks from arguments (added to those of --hooks)."""
    group = parser.add_argument_group("hooks from arguments")
    group.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help="POST each decision here, signed with the secret in --webhook-secret-env",
    )
    group.add_argument(
        "--webhook-secret-env",
        default=environment.WEBHOOK_SECRET.name,
        metavar="VAR",
        help="environment variable holding the webhook's HMAC secret (default: %(default)s)",
    )
    group.add_argument(
        "--command",
        dest="hook_command",
        action="append",
        default=[],
        metavar="CMD",
        help="run CMD with the decision JSON on stdin",
    )
    group.add_argument(
        "--drop-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="write <decision_id>.json into DIR",
    )
    group.add_argument(
        "--entry-point",
        action="append",
        default=[],
        metavar="NAME",
        help="a hook installed in the entry-point group faultlens.hooks",
    )


def _hook_items(args: argparse.Namespace) -> list[dict]:
    items: list[dict] = []
    for index, url in enumerate(args.webhook):
        items.append(
            {
                "type": "webhook",
                "name": f"webhook-{index}",
                "url": url,
                "secret_env": args.webhook_secret_env,
            }
        )
    for index, command in enumerate(args.hook_command):
        items.append({"type": "command", "name": f"command-{index}", "command": command})
    for index, directory in enumerate(args.drop_dir):
        items.append({"type": "file", "name": f"file-{index}", "directory": directory})
    for name in args.entry_point:
        items.append({"type": "entry_point", "name": name, "entry_point": name})
    return items


def _open_store(url: str) -> Store:
    return Store(url)


def _decision_rows(log: DecisionLog, job: str | None) -> list[dict]:
    rows = []
    for record in log.records().values():
        decision = record.decision
        if job is not None and decision.job_id != job:
            continue
        rows.append(
            {
                "decision_id": decision.decision_id,
                "incident_id": decision.incident_id,
                "job_id": decision.job_id,
                "issued_at": decision.issued_at,
                "action": decision.action.value,
                "class": decision.incident_class.value,
                "cause": decision.cause.value,
                "culprit_nodes": list(decision.culprit.nodes),
                "exclude_nodes": list(decision.exclude_nodes),
                "restore": None
                if decision.restore is None
                else f"{decision.restore.tier} step {decision.restore.step}",
                "confidence": round(decision.confidence, 3),
                "policy_rule": decision.policy_rule,
                "status": record.status.value,
                "hooks": {name: status.value for name, status in record.hooks.items()},
                "reason": decision.reason,
            }
        )
    return rows


def cmd_decisions(args: argparse.Namespace) -> int:
    _open_store(args.store).close()  # a clear error for a missing store before anything is created
    log = DecisionLog(args.store)
    try:
        rows = _decision_rows(log, args.job)
    finally:
        log.close()
    # the full record is in --json / --csv; the table keeps what fits a terminal
    if args.fmt == "table":
        keep = (
            "decision_id",
            "incident_id",
            "job_id",
            "action",
            "cause",
            "exclude_nodes",
            "restore",
            "status",
            "hooks",
        )
        rows = [{key: row[key] for key in keep} for row in rows]
    # at 80 columns the ids stay whole: these go first
    optional = ("hooks", "restore", "exclude_nodes", "cause", "job_id")
    emit(rows, args.fmt, title=f"decisions in {args.store}", optional=optional)
    return 0


def _catalog(specs: list[str] | None, job: str | None = None) -> CheckpointCatalog | None:
    if not specs:
        return None
    return CheckpointCatalog(parse_tiers(specs), job_id=job)


def _hooks(args: argparse.Namespace) -> list:
    hooks = load_hooks(args.hooks) if args.hooks else []
    hooks += hooks_from_config(_hook_items(args), source="arguments")
    names = [hook.name for hook in hooks]
    if len(set(names)) != len(names):
        raise CliError(
            f"hook names must be unique across --hooks and arguments: {', '.join(names)}"
        )
    return hooks


def cmd_decide(args: argparse.Namespace) -> int:
    config = load_policy(args.policy)
    hooks = _hooks(args)
    catalog = _catalog(args.tiers)
    store = _open_store(args.store)
    deliverer = Deliverer(args.store, hooks)
    policy = DecisionPolicy(config, history=StoreHistory(store), restore_chooser=catalog)
    try:
        incidents = incident_rows(store, job=args.job or None)
        decided = decided_incident_ids(store)
        rows = []
        failed = 0
        for row in incidents:
            if row["incident_id"] in decided:
                continue
            incident = Incident.from_row(row)
            decision: Decision = policy.decide(incident)
            results = deliverer.submit(decision)
            failed += sum(1 for r in results if r.status.value != "delivered")
            rows.append(
                {
                    "incident_id": incident.incident_id,
                    "decision_id": decision.decision_id,
                    "action": decision.action.value,
                    "exclude_nodes": list(decision.exclude_nodes),
                    "restore": None
                    if decision.restore is None
                    else f"{decision.restore.tier} step {decision.restore.step}",
                    "delivery": {r.hook: r.status.value for r in results},
                    "reason": decision.reason,
                }
            )
    finally:
        deliverer.close()
        store.close()
    emit(rows, args.fmt, title=f"{len(rows)} new decision(s)")
    return 1 if failed else 0


def cmd_deliver(args: argparse.Namespace) -> int:
    hooks = _hooks(args)
    if not hooks:
        raise CliError(
            "no hooks configured (--hooks FILE, --webhook, --command, --drop-dir, "
            "--entry-point): "
            "nothing to deliver to"
        )
    _open_store(args.store).close()
    deliverer = Deliverer(args.store, hooks)
    try:
        results = deliverer.redeliver()
    finally:
        deliverer.close()
    emit(
        [
            {
                "decision_id": r.decision_id,
                "hook": r.hook,
                "status": r.status.value,
                "attempts": r.attempts,
                "error": r.error,
            }
            for r in results
        ],
        args.fmt,
        title=f"{len(results)} delivery attempt(s)",
    )
    failed = sum(1 for r in results if r.status.value != "delivered")
    if failed:
        print(
            f"faultlens deliver: {failed} delivery(ies) still failing; they stay in the store "
            "for the next pass",
            file=sys.stderr,
        )
    return 1 if failed else 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    catalog = _catalog(args.tiers, args.job)
    if catalog is None:  # argparse requires --tiers; this guards an empty list
        raise CliError("--tiers: expected at least one tier")
    before = None
    if args.before:
        try:
            before = dt.datetime.fromisoformat(args.before)
        except ValueError:
            raise CliError(f"--before {args.before!r}: expected an ISO 8601 time") from None
        before = before if before.tzinfo else before.replace(tzinfo=dt.UTC)
    entries = catalog.scan()
    if args.verify:
        for entry in entries:
            catalog.verify(entry)
    choice = catalog.choose(
        args.exclude,
        before_ts=before,
        before_step=args.before_step,
        world_size=args.world_size,
        entries=entries,
    )
    chosen = {e.uri for e in choice.entries} if choice else set()
    rows = [
        {
            "tier": entry.tier.name,
            "step": entry.step,
            "layout": entry.layout.value,
            "complete": entry.complete,
            "ranks": "all" if entry.ranks is None else sorted(entry.ranks),
            "world_size": entry.world_size,
            "bytes": entry.bytes,
            "checksums": catalog.status_of(entry).value,
            "survives": entry.tier.survives(args.exclude),
            "chosen": entry.uri in chosen,
            "uri": entry.uri,
            "problem": entry.problem,
        }
        for entry in entries
    ]
    if args.record:
        from faultlens.collectors.store.sink import SegmentSink

        try:
            with SegmentSink(args.store) as sink:
                catalog.record(sink, entries)
        except (StoreError, OSError) as exc:
            raise CliError(str(exc)) from None
    emit(rows, args.fmt, title="checkpoints")
    if args.fmt == "table":
        if choice is None:
            print("restore: no checkpoint qualifies (a failover would start from the beginning)")
        else:
            print(
                f"restore: step {choice.step} from {choice.tier}"
                + (f" ({choice.uri})" if choice.uri else f" ({len(choice.sources)} rank sources)")
            )
    return 0
