"""`faultlens slurm run|node`: an instrumented job under sbatch (controller/slurm/launch.py);
`faultlens node-check NODE`: return a drained node, keep a repeat offender out
(controller/slurm/nodecheck.py); `faultlens nodes`: where each node stands
(controller/slurm/nodes.py)."""

from __future__ import annotations

import argparse

from faultlens.controller.cli.common import add_format_args, add_store_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "slurm",
        help="run an instrumented torchrun job under sbatch "
        "(identity from Slurm's, a node task per node)",
    )
    kinds = parser.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND")
    kinds.required = True
    run = kinds.add_parser("run", help="in the batch script: srun one node task per node")
    node = kinds.add_parser("node", help="one node's task: node agent, torchrun, failure report")
    for sub in (run, node):
        add_store_arg(sub)
        sub.add_argument("--nproc-per-node", type=int, default=1, help="ranks per node")
        sub.add_argument(
            "--work-dir",
            default="faultlens-slurm",
            help="where each node keeps torchrun's logs (default: %(default)s)",
        )
        sub.add_argument(
            "--agent-sources",
            default=None,
            metavar="LIST",
            help="run the node agent (`faultlens collect --sources LIST`) for the job's life",
        )
        sub.add_argument(
            "--agent-nvml-timeline",
            default=None,
            metavar="PATH",
            help="the agent's NVML source replays this recorded GPU timeline instead of NVML "
            "(docs/recorded-timeline.md); {node} in PATH is the node's name",
        )
        sub.add_argument(
            "script", nargs=argparse.REMAINDER, help="-- the training script and its arguments"
        )
    run.add_argument(
        "--state-dir",
        default=None,
        help="the Slurm hook's state_dir: the restore point of a failover",
    )
    run.add_argument(
        "--rdzv-port", type=int, default=29500, help="rendezvous port on the first node"
    )
    node.add_argument("--rdzv-endpoint", required=True, help="HOST:PORT of the rendezvous")
    run.set_defaults(func=cmd_run)
    node.set_defaults(func=cmd_node)

    check = subparsers.add_parser(
        "node-check",
        help="may a drained node come back? resume it when clean, keep a repeat offender out",
    )
    add_store_arg(check)
    check.add_argument("node", metavar="NODE", help="the Slurm node name")
    check.add_argument(
        "--window",
        type=float,
        default=7.0,
        help="days after a return in which a new failure makes a repeat offender "
        "(default %(default)s)",
    )
    check.add_argument(
        "--dry-run", action="store_true", help="check and record, change nothing in Slurm"
    )
    check.add_argument("--slurm-conf", default=None, help="slurm.conf (default: $SLURM_CONF)")
    gpus = check.add_mutually_exclusive_group()
    gpus.add_argument(
        "--nvml",
        action="store_true",
        help="also ask this machine's NVML now (run on the node itself, e.g. as Slurm's "
        "HealthCheckProgram)",
    )
    gpus.add_argument(
        "--nvml-timeline",
        default=None,
        metavar="FILE",
        help="ask a recorded GPU timeline instead of NVML (docs/recorded-timeline.md)",
    )
    check.add_argument(
        "--self-test",
        type=int,
        default=0,
        metavar="N",
        help="also run a gloo all_reduce across N local ranks here (run on the node itself); a "
        "failure keeps the node out",
    )
    check.add_argument(
        "--self-test-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the self-test may take, process starts included (default %(default)s)",
    )
    check.add_argument(
        "--json", dest="fmt", action="store_const", const="json", default="text", help="JSON output"
    )
    check.set_defaults(func=cmd_node_check)

    nodes = subparsers.add_parser(
        "nodes", help="nodes drained, returned and kept out as repeat offenders (from the store)"
    )
    add_store_arg(nodes)
    add_format_args(nodes)
    nodes.set_defaults(func=cmd_nodes)


def _script(args: argparse.Namespace) -> list[str]:
    script = list(args.script)
    if script and script[0] == "--":
        script = script[1:]
    if not script:
        raise SystemExit("faultlens slurm: name the training script after --")
    return script


def cmd_run(args: argparse.Namespace) -> int:
    from faultlens.controller.slurm.launch import run_job

    return run_job(
        _script(args),
        nproc_per_node=args.nproc_per_node,
        state_dir=args.state_dir,
        store=args.store,
        rdzv_port=args.rdzv_port,
        work_dir=args.work_dir,
        agent_sources=args.agent_sources,
        agent_nvml_timeline=args.agent_nvml_timeline,
    )


def cmd_node(args: argparse.Namespace) -> int:
    from faultlens.controller.slurm.launch import run_node

    return run_node(
        _script(args),
        nproc_per_node=args.nproc_per_node,
        rdzv_endpoint=args.rdzv_endpoint,
        work_dir=args.work_dir,
        store=args.store,
        agent_sources=args.agent_sources,
        agent_nvml_timeline=args.agent_nvml_timeline,
    )


def cmd_node_check(args: argparse.Namespace) -> int:
    import datetime as dt
    import json

    from faultlens.controller.slurm.commands import Slurm
    from faultlens.controller.slurm.nodecheck import Verdict, check_node

    slurm = Slurm(env={"SLURM_CONF": args.slurm_conf} if args.slurm_conf else None)
    gpus = None
    if args.nvml_timeline:
        from faultlens.collectors.sources.recorded_backend import RecordedBackend

        gpus = RecordedBackend(args.nvml_timeline)
    elif args.nvml:
        from faultlens.collectors.sources.nvml_backend import NvmlBackend

        gpus = NvmlBackend()
    check = check_node(
        args.node,
        args.store,
        slurm,
        window=dt.timedelta(days=args.window),
        act=not args.dry_run,
        gpus=gpus,
        self_test=args.self_test,
        self_test_timeout_s=args.self_test_timeout,
    )
    if args.fmt == "json":
        print(
            json.dumps(
                {
                    "node": check.node,
                    "verdict": check.verdict.value,
                    "action": check.action,
                    "events": check.events,
                    "event_kinds": check.event_kinds,
                    "reason": check.reason,
                    "self_test": check.self_test.to_dict() if check.self_test else None,
                }
            )
        )
    else:
        print(f"{check.node}: {check.verdict.value} ({check.action}): {check.reason}")
    return 0 if check.verdict is Verdict.PASS else 1


def cmd_nodes(args: argparse.Namespace) -> int:
    from faultlens.attribution.reading.store import Store
    from faultlens.controller.cli.common import emit
    from faultlens.controller.slurm.nodes import node_states

    with Store(args.store) as store:
        rows = [status.to_row() for status in node_states(store)]
    emit(rows, args.fmt, title="nodes")
    return 0
