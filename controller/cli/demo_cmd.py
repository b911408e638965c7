"""`faultlens demo`: the end-to-end demonstration (a real CPU torch job under the supervisor)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the end-to-end demo (not built yet)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("faultlens demo is not built yet: the supervisor, decisions and fault injection land with the "
          "decisions/demo issue. Meanwhile: faultlens tables / sql / compact / retention work on a store.")
    return 0
