"""`faultlens slurm run|node`: an instrumented job under sbatch (controller/slurm/launch.py)."""

from __future__ import annotations

import argparse

from faultlens.controller.cli.common import add_store_arg


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
    )
