"""`fleet records`: what the reconciler remembers, read from the record files under the spec directory.

Bad machines (excluded from every offer query: bad, permanent, banned) and machines on probation (an
expired bad record: rentable again), each with its standing at `--at` (default now: `RecordSet.standings`,
the reading the offer queries use) and the verdict that made it bad, measured throughput per machine (what
offer ranking uses), tripped image circuit breakers, and record files that cannot be read (exit 1: they are
excluded from offers until a human fixes them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.adapters.record_index import load_indexed
from reconciler.cli._shared import instant
from reconciler.domain.observations import format_time
from reconciler.domain.records import BadMachine, BenchmarkEntry, MachineRecord, RecordSet, Standing

REASON_WIDTH = 100


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("records", help="bad machines, measured throughput, image suspects, unreadable records")
    p.add_argument("--spec-dir", type=Path, default=Path("fleet-spec"), help="spec directory (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--at", type=instant, default=None, metavar="TIME",
                   help="read expiry and probation as of this UTC time (ISO 8601, e.g. 2026-12-02T22:00:00Z) "
                        "instead of now")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec_dir: Path = args.spec_dir
    if not spec_dir.is_dir():
        print(f"fleet records: {spec_dir} is not a directory (use --spec-dir)", file=sys.stderr)
        return 1
    records = load_indexed(spec_dir)
    now = args.at or datetime.now(UTC)
    if args.json:
        json.dump(to_json(records, now), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(records, spec_dir, now))
    for problem in records.problems:
        print(f"fleet records: unreadable record: {problem}", file=sys.stderr)
    return 1 if records.problems else 0


def deciding_entry(record: MachineRecord) -> BenchmarkEntry | None:
    """The verdict behind the record's status: newest entry that marked it bad (if bad), else the newest."""
    if record.is_bad:
        for entry in reversed(record.benchmarks):
            if entry.marks_bad:
                return entry
    return record.benchmarks[-1] if record.benchmarks else None


def _standing_json(bad: BadMachine, standing: Standing) -> dict[str, Any]:
    entry = bad.marking or bad.last  # what deciding_entry picks for a bad record
    return {"machine_id": bad.machine_id, "host_id": bad.host_id, "gpu_name": bad.gpu_name,
            "standing": standing.state, "excluded": standing.excluded,
            "until": format_time(standing.until) if standing.until else None, "standing_detail": standing.detail,
            "verdict": entry.verdict if entry else None, "reason": entry.reason if entry else bad.note,
            "at": entry.at if entry else None, "instance_id": entry.instance_id if entry else None}


def to_json(records: RecordSet, now: datetime) -> dict[str, Any]:
    standings = records.standings(now, passed_on_probation=True)
    return {
        "at": format_time(now),
        "counts": _counts(records),
        "bad_machines": [_standing_json(b, s) for b, s in standings if s.excluded],
        "probation": [_standing_json(b, s) for b, s in standings if s.state == "probation"],
        "perf": [vars(p).copy() for p in _perf(records)],
        "image_suspects": [img.to_yaml_dict() for img in records.images.values()],
        "problems": list(records.problems),
    }


def render_text(records: RecordSet, spec_dir: Path, now: datetime) -> str:
    counts = _counts(records)
    by_status = ", ".join(f"{n} {s}" for s, n in counts["machines_by_status"].items())
    out = [f"{spec_dir}: {counts['machines']} machine record(s)" + (f" ({by_status})" if by_status else "")
           + f", {counts['image_suspects_active']} active image suspect(s), {len(records.problems)} unreadable"]
    bad_rows, probation_rows = [], []
    for bad, standing in records.standings(now, passed_on_probation=True):
        e = bad.marking or bad.last
        reason = _clip((e.reason if e else bad.note) or "set bad by hand")
        if standing.excluded:
            bad_rows.append([bad.machine_id, standing.state, bad.host_id or "-", bad.gpu_name or "-",
                             e.verdict if e else "-", e.at if e else "-", reason])
        elif standing.state == "probation":
            probation_rows.append([bad.machine_id, standing.state, format_time(standing.until) if standing.until
                                   else "-", bad.host_id or "-", bad.gpu_name or "-", e.verdict if e else "-", reason])
    out += ["", f"Bad machines ({len(bad_rows)}): excluded from every offer query"]
    out += _table(["MACHINE", "STANDING", "HOST", "GPU", "LAST VERDICT", "DATE", "REASON"], bad_rows) if bad_rows \
        else ["  none"]
    if probation_rows:
        out += ["", f"On probation ({len(probation_rows)}): rentable again; a failure now is permanent"]
        out += _table(["MACHINE", "STANDING", "UNTIL", "HOST", "GPU", "LAST VERDICT", "REASON"], probation_rows)
    perf_rows = [[p.machine_id, p.gpu_name or "-", f"{p.median_proofs_per_hour:.1f}", f"{p.last_proofs_per_hour:.1f}",
                  str(p.samples)] for p in _perf(records)]
    out += ["", f"Measured throughput ({len(perf_rows)} machine(s), proofs/hour)"]
    out += _table(["MACHINE", "GPU", "MEDIAN", "LAST", "SAMPLES"], perf_rows) if perf_rows else ["  none"]
    img_rows = [[img.image_digest[:19], img.status, img.signature, ",".join(img.machines), img.tripped_at,
                 _clip(img.reason)] for img in records.images.values()]
    out += ["", f"Image suspects ({len(img_rows)})"]
    out += _table(["DIGEST", "STATUS", "SIGNATURE", "MACHINES", "TRIPPED", "REASON"], img_rows) if img_rows \
        else ["  none"]
    if records.problems:
        out += ["", f"Unreadable records ({len(records.problems)}): excluded from offers until fixed"]
        out += [f"  {p}" for p in records.problems]
    return "\n".join(out) + "\n"


def _perf(records: RecordSet) -> list[Any]:
    return sorted(records.perf_history().values(), key=lambda p: (-p.median_proofs_per_hour, p.machine_id))


def _counts(records: RecordSet) -> dict[str, Any]:
    by_status = records.status_counts()
    return {"machines": len(records.machines), "machines_by_status": by_status,
            "image_suspects_active": len(records.suspect_images()), "unreadable": len(records.problems)}


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_WIDTH else text[:REASON_WIDTH - 3] + "..."


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    table = [[str(cell) for cell in row] for row in [headers, *rows]]
    if any(len(row) != len(headers) for row in table):
        raise ValueError("every row needs one cell per header")
    widths = [max(map(len, column)) for column in zip(*table, strict=True)]
    line = "  " + "  ".join(f"{{:<{w}}}" for w in widths)  # one format call per row: 10,000 perf rows
    return [line.format(*row).rstrip() for row in table]
