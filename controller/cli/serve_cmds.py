"""`faultlens serve`: the always-on attribution service (controller/service.py): follow every job in
the store, decide, deliver to the hooks, /metrics for Prometheus."""

from __future__ import annotations

import argparse
import signal

from faultlens.controller.cli.common import add_rules_dir_arg, add_store_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="the always-on service: follow every job, decide, "
        "deliver to the hooks, serve /metrics",
    )
    add_store_arg(serve)
    serve.add_argument("--hooks", help="hooks YAML file (e.g. docs/deploy/slurm/hooks.yaml)")
    serve.add_argument("--policy", help="policy file (default rules/policy.yaml)")
    add_rules_dir_arg(serve)
    serve.add_argument(
        "--tiers",
        nargs="+",
        metavar="TIER",
        help="checkpoint tiers for the restore choice: a YAML file or KIND[@NODE]=URL ...",
    )
    serve.add_argument("--interval", type=float, default=2.0, help="seconds between passes")
    serve.add_argument(
        "--catch-up",
        type=float,
        default=30.0,
        help="seconds between passes over undecided incidents and undelivered decisions",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="port of /metrics (0: no endpoint; default %(default)s)",
    )
    serve.add_argument("--metrics-addr", default="127.0.0.1", help="address of /metrics")
    serve.add_argument(
        "--fr-root",
        default=None,
        metavar="DIR",
        help="the --work-dir of `faultlens slurm run`: when a job's progress stops, touch its "
        "attempt's flight-recorder trigger there and analyse the dumps its ranks write",
    )
    serve.add_argument(
        "--fr-wait",
        type=float,
        default=10.0,
        help="seconds to wait for requested dumps (default %(default)s)",
    )
    serve.add_argument("--max-passes", type=int, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from faultlens.attribution.policy import DecisionPolicy, StoreHistory, load_policy
    from faultlens.collectors.store.layout import resolve_store
    from faultlens.controller.checkpoints import CheckpointCatalog, parse_tiers
    from faultlens.controller.hooks import load_hooks
    from faultlens.controller.service import Service

    config = load_policy(args.policy)
    resolve_store(args.store, create=True)  # a new cluster's store: the jobs write it later
    hooks = load_hooks(args.hooks) if args.hooks else []
    catalog = CheckpointCatalog(parse_tiers(args.tiers)) if args.tiers else None

    def policy(store):
        return DecisionPolicy(config, history=StoreHistory(store), restore_chooser=catalog)

    follower = None
    if args.fr_root:
        from faultlens.attribution.engine import Engine
        from faultlens.attribution.follow import Follower
        from faultlens.controller.slurm.dumps import SlurmDumpRequester

        requester = SlurmDumpRequester(args.store, args.fr_root, wait_s=args.fr_wait)
        follower = Follower(args.store, engine=Engine(dump_requester=requester))
    service = Service(
        args.store,
        hooks,
        policy,
        interval_s=args.interval,
        catch_up_s=args.catch_up,
        follower=follower,
    )
    if args.metrics_port:
        service.serve_metrics(args.metrics_port, args.metrics_addr)
    signal.signal(signal.SIGTERM, lambda *_: service.stop())
    print(
        f"faultlens serve: following {args.store}; hooks: "
        f"{', '.join(h.name for h in hooks) or 'none'}"
        + (f"; /metrics on {args.metrics_addr}:{args.metrics_port}" if args.metrics_port else ""),
        flush=True,
    )
    try:
        service.run(max_passes=args.max_passes)
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
    return 0
