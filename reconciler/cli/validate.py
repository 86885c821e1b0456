"""`fleet validate [PATH]`: the PR check for the fleet spec and the owned-hosts inventory beside it (hosts.yaml),
alone and together. Every problem, one line each, exit 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reconciler.adapters.spec_files import check_hosts_text, check_spec_text, cross_problems, hosts_path
from reconciler.domain.hosts import OwnedHost
from reconciler.domain.spec import FleetSpec, SpecProblem

DEFAULT_SPEC = Path("fleet-spec/fleet.yaml")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a fleet spec against the schema and semantic rules")
    p.add_argument("path", nargs="?", type=Path, default=DEFAULT_SPEC, help="spec file (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _check_hosts(spec_path: Path, spec: FleetSpec | None) -> tuple[list[SpecProblem], tuple[OwnedHost, ...] | None]:
    """The owned-hosts inventory beside the spec, alone and together with the spec (when both parsed)."""
    path = hosts_path(spec_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        hosts: tuple[OwnedHost, ...] | None = ()
        problems: list[SpecProblem] = []
    except (OSError, UnicodeDecodeError) as exc:
        return [SpecProblem(str(path), "$", f"cannot read: {exc}")], None
    else:
        hosts, problems = check_hosts_text(text, str(path))
    if spec is not None and hosts is not None:
        problems += cross_problems(spec, hosts, str(spec_path), str(path))
    return problems, hosts


def run(args: argparse.Namespace) -> int:
    path: Path = args.path
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = "file not found" if isinstance(exc, FileNotFoundError) else f"cannot read: {exc}"
        spec, problems = None, [SpecProblem(str(path), "$", reason)]
    else:
        spec, problems = check_spec_text(text, str(path))
        if spec is not None and any(pool.min_count is not None for pool in spec.pools):
            # The leader's capacity.yaml beside it must be readable too: it holds the autoscaled pools' slots.
            from reconciler.adapters.capacity_files import load_capacity

            capacity_problems = load_capacity(path)[1]
            problems += capacity_problems
            spec = None if capacity_problems else spec
        hosts_problems, hosts = _check_hosts(path, spec)
        problems += hosts_problems
        if any(p.severity == "error" for p in hosts_problems):
            spec = None
    errors = [p for p in problems if p.severity == "error"]
    if args.json:
        json.dump({"valid": spec is not None, "problems": [p.to_json() for p in problems]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for p in problems:
            print(p, file=sys.stderr if p.severity == "error" else sys.stdout)
        if spec is not None:
            slots = sum(pool.count for pool in spec.pools)
            print(f"{path}: ok: {len(spec.pools)} pool(s), {slots} slot(s)"
                  + (f", {len(problems)} warning(s)" if problems else ""))
            if hosts:
                gpus = sum(h.gpu_count for h in hosts)
                print(f"{hosts_path(path)}: ok: {len(hosts)} owned host(s), {gpus} GPU(s)")
            for pool in spec.pools:
                if pool.hosts is not None:
                    serving = [h.name for h in hosts or () if h.serves(pool.gpu_name, pool.hosts) and
                               h.state == "active"]
                    print(f"  pool {pool.name}: on owned hosts ({pool.hosts.describe()}): {', '.join(serving)}")
                if pool.min_count is not None:
                    low, high = pool.bounds
                    print(f"  pool {pool.name}: {low}..{high} slots (autoscaled): up to "
                          f"${low * pool.max_price_usd_per_hour:.2f}/h at min, "
                          f"${high * pool.max_price_usd_per_hour:.2f}/h at max (max price "
                          f"${pool.max_price_usd_per_hour:g}/h per slot)")
                    market = pool.queue.market if pool.queue is not None else None
                    if market is not None and pool.min_rate_proofs_per_hour > 0:
                        worst = pool.max_price_usd_per_hour / pool.min_rate_proofs_per_hour * (1 + market.min_margin)
                        print(f"  pool {pool.name}: Snark Market work counts as demand while a proof pays more than "
                              f"its measured $/proof + {market.min_margin:.0%} (at most ${worst:.4f} = "
                              f"{worst / market.usd_per_fil:.6g} FIL at ${market.usd_per_fil:g}/FIL: max price over "
                              "min rate)")
        else:
            print(f"{path}: {len(errors)} error(s)", file=sys.stderr)
    return 0 if spec is not None else 1
