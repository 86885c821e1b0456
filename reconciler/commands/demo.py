"""`fleet demo`: run the whole loop locally (see reconciler/demo.py). Behind `make demo`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reconciler.demo import DEFAULT_TIME_SCALE, DemoError, DemoSettings, run_demo


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run spec -> image -> hosts -> benchmarks -> verdicts -> commits locally")
    p.add_argument("--workdir", type=Path, default=Path(".fleet-demo"),
                   help="workspace, recreated on every run (default: %(default)s)")
    p.add_argument("--deadline", type=float, default=110.0, help="give up after this many seconds")
    p.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                   help="real seconds the cuzk-bench stand-in sleeps per simulated second")
    p.add_argument("--proofs", type=int, default=4, help="proofs per benchmark")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = DemoSettings(workdir=args.workdir, deadline_s=args.deadline, time_scale=args.time_scale,
                            proofs=args.proofs)
    try:
        outcome = run_demo(settings, echo=lambda line: print(line, flush=True))
    except DemoError as exc:
        print(f"fleet demo: {exc}", file=sys.stderr)
        return 1
    return 0 if outcome.converged else 1
