"""`faultlens run` (the reference supervisor) and `faultlens demo` (the supervisor on the demo job
with faults).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import time
from pathlib import Path

from faultlens.controller.cli.common import CliError, add_rules_dir_arg, add_store_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="run the end-to-end demo: a real CPU torch job with "
                                              "injected faults")
    add_store_arg(demo)
    demo.add_argument("--workdir", default="./faultlens-demo", help="checkpoints, logs and dumps "
                                                                    "(default %(default)s)")
    demo.add_argument("--steps", type=int, default=400, help="training steps of the job")
    demo.add_argument("--faults", type=int, default=5, help="how many faults of the schedule to "
                                                            "inject (1-5)")
    demo.add_argument("--keep", action="store_true", help="keep an existing workdir instead of "
                                                          "starting clean")
    add_rules_dir_arg(demo)
    demo.set_defaults(func=cmd_demo)

    run = subparsers.add_parser("run", help="supervise a torchrun job on simulated nodes: "
                                            "attribute, fail over")
    add_store_arg(run)
    run.add_argument("--nnodes", type=int, required=True)
    run.add_argument("--nproc-per-node", type=int, required=True)
    run.add_argument("--spares", type=int, default=0)
    run.add_argument("--workdir", default="./faultlens-run")
    run.add_argument("--job", help="job id (default: generated)")
    run.add_argument("--policy", help="policy YAML (default rules/policy.yaml)")
    run.add_argument("--thresholds", help="thresholds YAML (default rules/thresholds.yaml)")
    add_rules_dir_arg(run)
    run.add_argument("--hooks", help="hooks YAML: where decisions are delivered besides the "
                                     "supervisor")
    run.add_argument("--max-attempts", type=int, default=8)
    run.add_argument("--hang-grace", type=float, default=15.0, metavar="S",
                     help="after a hang incident naming no stuck rank, seconds the job gets to end "
                          "by itself (a "
                          "finished job tearing down slowly is not hung) before it is stopped "
                          "(default %(default)s)")
    run.add_argument("--checkpoint-wait", type=float, default=120.0, metavar="S",
                     help="a straggler's failover waits at most this long for the next checkpoint "
                          "(default "
                          "%(default)s)")
    run.add_argument("--total-steps", type=int, default=None, metavar="N",
                     help="the steps the job will run (FAULTLENS_TOTAL_STEPS for the step timer): "
                          "the job's remaining "
                          "time a slowdown's failover is weighed against; unset: unknown, a "
                          "slowdown is notified")
    run.add_argument("--assume-remaining", type=float, default=None, metavar="S",
                     help="for a job that declares no length: the remaining seconds the slowdown "
                          "policy weighs a "
                          "failover against (default: the policy's straggler.remaining_s; null "
                          "there: notify)")
    run.add_argument("train_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                     help="the training script and its arguments: -- train.py ARGS (or -- -m "
                          "module ARGS)")
    run.set_defaults(func=cmd_run)


def _hooks(path: str | None) -> list:
    if not path:
        return []
    from faultlens.controller.hooks.config import load_hooks

    return list(load_hooks(path))  # a HookConfigError names the file; the CLI prints it




def _printer():
    """Timestamped event lines, literal (no markup from the text), folded under the timestamp."""
    import sys

    from faultlens.controller.report.render import render_text

    started = time.monotonic()

    def say(text: str) -> None:
        # folded at spaces only: a path or a "[file.cc:537]" tag in torch's text stays whole
        # (copyable)
        render_text(
            f"{time.monotonic() - started:6.1f}s {text}",
            out=sys.stdout,
            hanging=" " * 8,
            break_words=False,
        )

    return sys.stdout, say


def _gpu_note() -> str:
    """The supervisor's simulated nodes report GPU samples from a recorded NVML backend, never this
    machine's.
    """
    has_gpu = Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None
    return ("GPU samples are simulated (a recorded NVML backend per simulated node): "
            + ("this machine's GPUs are not read" if has_gpu else "this machine has no NVIDIA GPU "
                                                                  "(a CPU-only job)"))


def cmd_run(args: argparse.Namespace) -> int:
    command = [c for c in args.train_command if c != "--"] if args.train_command else []
    if not command:
        raise CliError("give the training command after --, e.g. faultlens run --nnodes 2 "
                       "--nproc-per-node 2 -- "
                       "train.py")
    if args.nnodes < 1 or args.nproc_per_node < 1 or args.spares < 0:
        raise CliError("--nnodes and --nproc-per-node must be >= 1, --spares >= 0")
    # before anything heavy is imported: a script that cannot run is said within a second (its
    # imports are looked up by the supervisor, which records the job error in the store)
    from faultlens.controller.supervisor.preflight import check_command

    problem = check_command(command, imports=False)
    if problem is not None:
        import sys

        print(
            f"faultlens run: job error (no node to blame): the training script cannot run: "
            f"{problem.error}",
            file=sys.stderr,
        )
        for line in problem.stderr:
            print(f"  | {line}", file=sys.stderr)
        return 1

    from faultlens.controller.supervisor.run import RunConfig, Supervisor

    config = RunConfig(
        script=tuple(command),
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        spares=args.spares,
        store=args.store,
        workdir=Path(args.workdir),
        job_id=args.job or f"job-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}",
        max_attempts=args.max_attempts,
        policy_path=Path(args.policy) if args.policy else None,
        thresholds_path=Path(args.thresholds) if args.thresholds else None,
        hang_grace_s=max(0.0, args.hang_grace),
        checkpoint_wait_s=max(0.0, args.checkpoint_wait),
        total_steps=args.total_steps if args.total_steps and args.total_steps > 0 else None,
        assumed_remaining_s=args.assume_remaining
        if args.assume_remaining is not None and args.assume_remaining >= 0
        else None,
    )
    _, say = _printer()
    say(_gpu_note())
    supervisor = Supervisor(config, hooks=_hooks(args.hooks), on_event=say)
    try:
        result = supervisor.run()
    finally:
        supervisor.close()
    # everything it opened is closed (the summary's store below too): the process ends as soon as
    # the verdict is printed, not after the interpreter's teardown (cli/main.py)
    args.exit_at_once = True
    import sys

    from faultlens.controller.report.render import render_text
    from faultlens.controller.supervisor.summary import summary_lines

    try:
        for line in summary_lines(result):
            render_text(line, hanging="    ", break_words=False)
    except Exception as exc:  # the run's result stands without its summary
        print(f"faultlens run: cannot read the summary from the store: {exc}", file=sys.stderr)
    last = result.attempts[-1] if result.attempts else None
    if result.job_error is not None:
        print(
            f"faultlens run: job error (no node to blame): {result.job_error.error}",
            file=sys.stderr,
        )
        return 1
    if last is not None and last.last_step is None and result.outcome.value != "completed":
        from faultlens.controller.cli.startup import start_failure_lines

        cause, *where = start_failure_lines(Path(args.workdir), last.attempt)
        render_text(cause, hanging="    ", break_words=False)  # paths in it stay whole
        for line in where:
            print(line)  # a path: never folded
    return 0 if result.outcome.value == "completed" else 1


def _write_html(store: str, job_id: str, path: Path) -> Path | None:
    """The job's HTML report (faultlens report); None, with the reason on stderr, when it cannot be
    written.
    """
    import sys

    from faultlens.attribution.reading.store import Store
    from faultlens.controller.report.html import write_report

    try:
        with Store(store) as reader:
            return write_report(reader, job_id, path)
    except Exception as exc:  # the demo's result stands without its report
        print(f"faultlens demo: cannot write the HTML report: {exc}", file=sys.stderr)
        return None


def cmd_demo(args: argparse.Namespace) -> int:
    from faultlens.controller.demo.config import NNODES, NPROC, demo_run_config
    from faultlens.controller.demo.report import print_report
    from faultlens.controller.demo.schedule import DEMO_FAULTS, demo_fault
    from faultlens.controller.supervisor.run import Supervisor, write_summary

    if not 1 <= args.faults <= len(DEMO_FAULTS):
        raise CliError(f"--faults must be between 1 and {len(DEMO_FAULTS)}")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CliError(
            "the demo runs a real torch job: pip install -e '.[torch]' torch==2.13.0"
        ) from None
    workdir = Path(args.workdir)
    if workdir.exists() and not args.keep:
        shutil.rmtree(workdir)
    nnodes, nproc = NNODES, NPROC
    config = demo_run_config(
        steps=args.steps,
        store=args.store,
        workdir=workdir,
        job_id=f"demo-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}",
        max_attempts=args.faults + 1,
    )
    out, say = _printer()
    say(
        f"faultlens demo: job {config.job_id}, {nnodes} nodes x {nproc} ranks (DDP over gloo, "
        "CPU), 4 spare nodes, "
        f"store {args.store}"
    )

    def faults(attempt: int, nodes: list[str], start_step: int):
        if attempt >= args.faults:
            return demo_fault(len(DEMO_FAULTS), nodes, start_step, nproc)
        return demo_fault(attempt, nodes, start_step, nproc)

    supervisor = Supervisor(config, faults=faults, on_event=say)
    started = time.monotonic()
    try:
        result = supervisor.run()
    finally:
        supervisor.close()
    html = _write_html(args.store, result.job_id, workdir / "report.html")
    report = print_report(
        result, out, wall_s=time.monotonic() - started, store=args.store, html=html
    )
    write_summary(result, workdir / "summary.json")
    if report is not None:
        (workdir / "goodput.json").write_text(json.dumps(report.to_dict(), indent=1))
    return 0
