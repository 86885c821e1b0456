"""`fleet why MACHINE_ID`: the audit trail of one machine, read from git (see `reconciler.flows.why`).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from reconciler.adapters.git import GitReader, GitStoreError
from reconciler.adapters.record_files import parse_machine_record
from reconciler.adapters.record_history import RecordHistoryParser
from reconciler.domain.hosts import HOST_NAME, host_story, machine_id_of_argument
from reconciler.domain.observations import parse_time
from reconciler.domain.records import MACHINES_DIR, RecordError, check_machine_id
from reconciler.domain.redact import escape_lines
from reconciler.flows.why import (
    DEFAULT_SHOWN,
    DEFAULT_TAIL,
    commits_to_read,
    explain,
    parsed_record,
    render_text,
    to_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("why", help="why a machine was judged as it was: its verdict commits and evidence")
    p.add_argument("machine_id", nargs="?", help="marketplace machine id, e.g. 40213; an owned host's GPU as "
                                                 "<host>/<GPU UUID>, e.g. gpu-a/GPU-3b2f...; or an owned host "
                                                 "(its GPUs and whether several failed alike)")
    p.add_argument("--pool", default=None, help="instead of a machine: the capacity decisions of this autoscaled "
                                                "pool (its Fleet-Capacity commits), newest first")
    p.add_argument("--repo", type=Path, default=None, help="git checkout to read (default: the current one)")
    p.add_argument("--spec-dir", default="fleet-spec", help="spec directory inside the repo (default: %(default)s)")
    p.add_argument("--tail", type=int, default=DEFAULT_TAIL, help="log lines shown per verdict (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    paging = p.add_mutually_exclusive_group()
    paging.add_argument("--newest", type=int, default=DEFAULT_SHOWN, metavar="N",
                        help="show the newest N verdict commits (default: %(default)s)")
    paging.add_argument("--all", action="store_true", help="show every verdict commit")
    p.add_argument("--at", default=None, help="judge expiry/probation at this RFC 3339 time (default: now)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.pool is not None or args.machine_id is None:
        return _pool_history(args)
    if HOST_NAME.match(args.machine_id) and not args.json:
        story = _host_story(args)
        if story:
            print("\n".join(story))
            return 0
    try:
        machine_id = check_machine_id(machine_id_of_argument(args.machine_id))
    except RecordError as exc:
        print(f"fleet why: {exc}", file=sys.stderr)
        return 2
    spec_dir = PurePosixPath(args.spec_dir).as_posix()
    record_path = f"{spec_dir}/machines/{machine_id}.yaml"
    shown = None if args.all else max(1, args.newest)
    try:
        reader = GitReader.discover(args.repo or Path.cwd())
        # One `git log --grep` for the verdict commits, one cat-file for the record now; the records as of
        # older commits only for the shown verdicts whose entries are no longer in today's record.
        trail = reader.machine_trail(machine_id, ref="HEAD", spec_dir=spec_dir)
        # Each text parsed once, here; the flow works on the records. Today's record in one go, the older
        # versions (only those of verdicts whose entries are gone from it) line by line: they share most lines.
        current = parsed_record(trail.current_text, lambda text: parse_machine_record(text, Path(record_path)))
        wanted = commits_to_read(trail.verdicts, current, shown)
        versions = RecordHistoryParser(Path(record_path))
        historical = {sha: parsed_record(text, versions.parse)
                      for sha, text in (reader.records_at(wanted, record_path) if wanted else {}).items()}
        hint = reader.history_shape().hint()
    except GitStoreError as exc:
        print(f"fleet why: {exc}", file=sys.stderr)
        return 2
    if hint:
        print(f"fleet why: hint: {hint}", file=sys.stderr)
    try:
        now = parse_time(args.at) if args.at else datetime.now(UTC)
    except ValueError as exc:
        print(f"fleet why: --at {args.at!r}: {exc}", file=sys.stderr)
        return 2
    history = explain(machine_id, record_path, list(trail.verdicts), current, trail.last_change, now,
                      historical=historical, shown=shown)
    if history.status == "unknown":
        print(f"fleet why: machine {machine_id} is unknown in {trail.workdir}: no {record_path} and no commit "
              f"with a 'Fleet-Machine: {machine_id}' trailer on the checked-out branch", file=sys.stderr)
        return 1
    if args.json:
        json.dump(to_json(history), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(escape_lines(render_text(history, max(0, args.tail))))
    return 0


def _host_story(args: argparse.Namespace) -> list[str]:
    """`fleet why <host>`: the owned host's GPUs as the checkout's records have them (empty: not a host on record).
    Only the host's own record files (`<host>.<GPU UUID>.yaml`) are read: a marketplace machine id also has the
    shape of a host name, and `fleet why 40213` must not parse every record of the fleet first."""
    machines = (args.repo or Path.cwd()) / args.spec_dir / MACHINES_DIR
    records = []
    for file in sorted(machines.glob(f"{args.machine_id}.GPU-*.yaml")):  # HOST_NAME: no glob characters
        try:
            records.append(parse_machine_record(file.read_text(encoding="utf-8"), file))
        except (RecordError, OSError, UnicodeDecodeError, TypeError):
            continue  # as load_records: an unreadable record is not part of the story
    now = parse_time(args.at) if args.at else datetime.now(UTC)
    return host_story(args.machine_id, records, now)


def _pool_history(args: argparse.Namespace) -> int:
    from reconciler.adapters.capacity_files import GitHistoryError, capacity_history

    if args.pool is None or args.machine_id is not None:
        print("fleet why: give a MACHINE_ID or --pool POOL (one of them)", file=sys.stderr)
        return 2
    try:
        changes = capacity_history(args.repo or Path.cwd(), args.pool, PurePosixPath(args.spec_dir).as_posix())
    except (GitHistoryError, OSError) as exc:
        print(f"fleet why: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"pool": args.pool, "decisions": [{"commit": c.commit, "at": c.at, "decision": c.trailer}
                                                    for c in changes]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not changes:
        print(f"fleet why: no capacity decision for pool {args.pool} (no 'Fleet-Capacity: {args.pool} ...' "
              f"trailer on a commit of {args.spec_dir}/capacity.yaml)", file=sys.stderr)
        return 1
    print(f"capacity decisions for pool {args.pool}, newest first (git log of {args.spec_dir}/capacity.yaml):")
    for c in changes:
        print(f"  {c.at}  {c.commit[:12]}  {c.trailer}")
    return 0
