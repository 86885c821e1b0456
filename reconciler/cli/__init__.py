"""`fleet` command line: the imperative shell around every flow.

Each subcommand lives in `reconciler/cli/<name>.py` with `register(subparsers)`; this module only
assembles them, so adding a command never touches another's code. Exit codes: 0 ok, 1 the input or the
fleet has a problem the output names, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Order is the order `fleet --help` lists them.
COMMAND_MODULES = (
    "validate",
    "records",
    "why",
    "plan",
    "apply",
    "controller",
    "reconcile",
    "status",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleet", description="GPU proving fleet manager (spec in git).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"reconciler.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
