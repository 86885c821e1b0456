"""fleet-spec/capacity.yaml: the leader's desired count per autoscaled pool, one line per pool (bot-owned).

Place in the flow: `spec_files.load_spec` reads it beside fleet.yaml and hands the entries to
`domain.capacity.apply_entries` (so `fleet apply`, `fleet plan`, status and the Pulumi program all see the
pool's current slots); the pass writes it back through `render_capacity` when `domain.capacity` changed
something. Each line is one JSON object (every YAML reader reads it; a change is a one-line diff):

    rtx4090: {"desired": 6, "slots": [0, 1, 2, 3, 4, 5], "draining": [], "changed_at": "...", ...}

Humans do not edit it: bounds live in fleet.yaml (`count: {min, max}`; min == max pins a count).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.adapters.yaml_library import yaml_library
from reconciler.domain.capacity import CapacityEntry
from reconciler.domain.observations import format_time, parse_time
from reconciler.domain.spec import FleetSpec, SpecProblem

CAPACITY_FILE = "capacity.yaml"

HEADER = ("# Written by the fleet's leader (bot): the desired slot count of each autoscaled pool, with the reason\n"
          "# and the signals behind it. Do not edit: set count: {min, max} in fleet.yaml (min == max pins a count).\n")


def capacity_path(spec_path: Path) -> Path:
    return spec_path.parent / CAPACITY_FILE


def render_capacity(entries: Mapping[str, CapacityEntry]) -> str:
    lines = [HEADER]
    for name in sorted(entries):
        e = entries[name]
        doc = {"desired": e.desired, "slots": list(e.slots), "draining": list(e.draining),
               "changed_at": format_time(e.changed_at) if e.changed_at else None, "direction": e.direction,
               "reason": e.reason, "signals": dict(e.signals)}
        lines.append(f"{json.dumps(name)}: {json.dumps(doc, sort_keys=False)}\n")
    return "".join(lines)


def _index_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 10000
                                              for i in value) or len(set(value)) != len(value):
        return None
    return tuple(value)


def parse_capacity(text: str, file: str) -> tuple[dict[str, CapacityEntry], list[SpecProblem]]:
    """Entries by pool, and every problem (each naming the pool and field). A broken file is an error: the
    slots of autoscaled pools are unknown without it, and guessing could delete machines mid-proof."""
    yaml, loader, _ = yaml_library()

    try:
        doc = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return {}, [SpecProblem(file, "$", f"not valid YAML: {getattr(exc, 'problem', None) or exc}",
                                mark.line + 1 if mark is not None else None)]
    if doc is None:
        return {}, []
    if not isinstance(doc, dict):
        return {}, [SpecProblem(file, "$", f"expected a mapping of pool name -> entry, got {type(doc).__name__}")]
    entries: dict[str, CapacityEntry] = {}
    problems: list[SpecProblem] = []
    for pool, raw in doc.items():
        where = f"$.{pool}"

        def bad(field: str, message: str, where: str = where) -> None:
            problems.append(SpecProblem(file, f"{where}.{field}" if field else where, message))

        if not isinstance(raw, dict):
            bad("", f"got {json.dumps(raw, default=str)[:60]}, expected a mapping with desired/slots")
            continue
        desired, slots, draining = raw.get("desired"), _index_list(raw.get("slots")), _index_list(
            raw.get("draining", []))
        if not isinstance(desired, int) or isinstance(desired, bool) or desired < 0:
            bad("desired", f"got {raw.get('desired')!r}, expected an integer >= 0")
            continue
        if slots is None:
            bad("slots", f"got {raw.get('slots')!r}, expected a list of distinct slot indices >= 0")
            continue
        if draining is None or not set(draining) <= set(slots):
            bad("draining", f"got {raw.get('draining')!r}, expected slot indices that are in slots")
            continue
        changed_at = None
        if raw.get("changed_at") is not None:
            try:
                changed_at = parse_time(str(raw["changed_at"]))
            except ValueError:
                bad("changed_at", f"got {raw['changed_at']!r}, expected an RFC 3339 time")
                continue
        direction = raw.get("direction")
        if direction not in (None, "up", "down"):
            bad("direction", f"got {direction!r}, expected up, down or null")
            continue
        signals: dict[str, Any] = raw["signals"] if isinstance(raw.get("signals"), dict) else {}
        entries[str(pool)] = CapacityEntry(str(pool), desired, slots, draining, changed_at, direction,
                                           str(raw.get("reason", "")), signals)
    return entries, problems


def load_capacity(spec_path: Path) -> tuple[dict[str, CapacityEntry], list[SpecProblem]]:
    path = capacity_path(spec_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, []
    except (OSError, UnicodeDecodeError) as exc:
        return {}, [SpecProblem(str(path), "$", f"cannot read: {exc}")]
    return parse_capacity(text, str(path))


def capacity_entries(spec: FleetSpec, spec_path: Path) -> dict[str, CapacityEntry]:
    """The leader's entries for a spec with autoscaled pools ({} without any, or when the file is unreadable:
    loading the spec already refused a broken one)."""
    if not any(p.min_count is not None for p in spec.pools):
        return {}
    return load_capacity(spec_path)[0]


@dataclass(frozen=True)
class CapacityChange:
    """One capacity commit for a pool, from its `Fleet-Capacity:` trailer."""

    commit: str
    at: str
    trailer: str


def capacity_history(repo: Path, pool: str, spec_dir: str = "fleet-spec") -> list[CapacityChange]:
    """Every capacity decision for `pool`, newest first: one path-limited `git log` of capacity.yaml with its
    `Fleet-Capacity` trailers (raises GitHistoryError when `repo` is not a git checkout)."""
    fmt = "%H%x1f%cI%x1f%(trailers:key=Fleet-Capacity,valueonly,separator=%x1e)%x1d"
    proc = subprocess.run(["git", "log", f"--format={fmt}", "HEAD", "--", f"{spec_dir}/{CAPACITY_FILE}"],
                          cwd=repo, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise GitHistoryError(f"git log in {repo}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    out = []
    for record in proc.stdout.split("\x1d"):
        parts = record.strip("\n").split("\x1f")
        if len(parts) != 3:
            continue
        commit, at, trailers = parts
        for trailer in trailers.split("\x1e"):
            trailer = trailer.strip()
            if trailer.startswith(f"{pool} "):
                out.append(CapacityChange(commit, at, trailer))
    return out


class GitHistoryError(Exception):
    """The capacity history could not be read (not a git checkout, git failed)."""
