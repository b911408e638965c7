"""`faultlens ingest KIND ...`: one-shot imports of artifacts into the store. Each kind lives in its
own module, listed in INGEST_MODULES, which provides register_ingest(kind_subparsers)."""

from __future__ import annotations

import argparse

from faultlens.controller.cli import gpu_cmds, hang_cmds, job_cmds, steps_cmds

INGEST_MODULES: list = [gpu_cmds, hang_cmds, job_cmds, steps_cmds]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ingest", help="import artifacts (kernel logs, dcgm scrapes, "
                                                  "dumps, torchrun logs)")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND")
    kinds.required = True
    for module in INGEST_MODULES:
        module.register_ingest(kinds)
