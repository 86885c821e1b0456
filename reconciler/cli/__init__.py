"""`fleet` command line: the imperative shell around every flow.

Each subcommand lives in `reconciler/cli/<name>.py` with `register(subparsers)`; this module only
assembles them, so adding a command never touches another's code. Exit codes: 0 ok, 1 the input or the
fleet has a problem the output names, 2 usage error.

Imports are lazy: `fleet --help` imports no command module (their one-line help is in COMMANDS), and
`fleet <command>` imports only that command's module, so `fleet validate` never loads Pulumi, gitpython or
the HTTP stack (tests/unit/test_cli_imports.py holds both to it).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Command -> its one-line help, in the order `fleet --help` lists them. The help must equal what the
#: command's module registers (a test compares them).
COMMANDS = {
    "validate": "check a fleet spec against the schema and semantic rules",
    "records": "bad machines, measured throughput, image suspects, unreadable records",
    "why": "why a machine was judged as it was: its verdict commits and evidence",
    "plan": "show desired pools vs records/slots and the actions apply would take",
    "apply": "converge slots to the spec through the slot provider (no Pulumi engine)",
    "controller": "the worker-report HTTP API (serve) and worker tokens (token)",
    "reconcile": "judge benchmarks and commit machine records (one pass or a loop)",
    "status": "pools, guards, instance timelines and root causes",
    "db": "controller store maintenance (copy SQLite into PostgreSQL)",
    "demo": "run spec -> image -> hosts -> benchmarks -> verdicts -> commits locally",
}
COMMAND_MODULES = tuple(COMMANDS)


def _environment_help() -> str:
    """The environment variables the package reads, for `fleet --help` (the README points here)."""
    from reconciler.adapters.settings import ENVIRONMENT

    width = max(map(len, ENVIRONMENT))
    return "environment:\n" + "\n".join(f"  {name:<{width}}  {meaning}" for name, meaning in ENVIRONMENT.items())


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that command's module is imported (the others appear by name and help)."""
    parser = argparse.ArgumentParser(prog="fleet", description="GPU proving fleet manager (spec in git).",
                                     epilog=_environment_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"reconciler.cli.{name}").register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def _chosen_command(argv: Sequence[str]) -> str:
    """The command named in argv ("" if none: then argparse prints help or the usage error)."""
    for arg in argv:
        if arg == "--":
            break
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else ""
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_chosen_command(argv)).parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
