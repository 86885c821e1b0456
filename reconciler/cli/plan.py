"""`fleet plan [--format text|json|markdown] [--what-if]`: what `fleet apply` (or `pulumi up`) would do, without
doing it; with `--what-if`, what the spec would have done over the fleet's own last days (flows/whatif.py).

The PR check beside `fleet validate`: needs no credentials. With no `--state-dir` it compares the desired
pools with the records only (bad machines known, paused pools) and says so; with `--state-dir` it also
reads the slots a previous `fleet apply` left, refreshed from the marketplace when `--backend` is given,
and lists the actions `planner.plan()` returns - the same planner `fleet apply` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from reconciler.adapters.slot_provider import SLOT_STATE_FILE, SlotProvider, describe_error, load_slot_state
from reconciler.cli._shared import instant
from reconciler.cli.apply import add_backend_arguments, make_marketplace
from reconciler.domain.capacity import CapacityEntry
from reconciler.domain.forecast import PoolForecast, fleet_forecast
from reconciler.domain.marketplace import MarketplaceError
from reconciler.domain.observations import format_time
from reconciler.domain.planner import ObservedSlot, SlotPlan, plan, pool_pause, short_digest, spend_cap_note
from reconciler.domain.records import RecordSet
from reconciler.domain.slots import SlotError
from reconciler.domain.snark_market import economics_from_json
from reconciler.domain.spec import FleetSpec
from reconciler.flows.provision import ApplyError, load_inputs, resolve_image
from reconciler.render.markdown import render_plan_markdown

RECORDS_ONLY_NOTE = ("no --state-dir given: showing desired pools against the records only (no running "
                     "instances known, no actions)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="show desired pools vs records/slots and the actions apply would take")
    add_backend_arguments(p, required=False)
    p.add_argument("--format", choices=("text", "json", "markdown"), default=None,
                   help="text (default), json, or markdown: the PR comment with the slot diff and each pool's "
                        "expected proofs/h and $/h from the machines' history")
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.add_argument("--at", type=instant, default=None, metavar="TIME",
                   help="read record expiry and probation as of this UTC time (ISO 8601) instead of now")
    p.add_argument("--what-if", action="store_true",
                   help="also replay the fleet's own history (verdicts, guards, capacity, spend) under the base "
                        "spec and this spec, and show what differs (docs/what-if.md)")
    p.add_argument("--since", type=duration_days, default=30.0, metavar="DURATION",
                   help="with --what-if: how far back to replay, e.g. 30d, 12h (default: 30d)")
    p.add_argument("--base", default="HEAD", metavar="REF",
                   help="with --what-if: the branch the PR merges into: its history is replayed and its spec is "
                        "the base (default: %(default)s)")
    p.set_defaults(func=run)


def duration_days(text: str) -> float:
    """`30d`, `12h`, `90m` (or a number of days) -> days."""
    units = {"d": 1.0, "h": 1 / 24, "m": 1 / 1440}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "d")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 30d, 12h or 90m") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be > 0")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        spec, records = load_inputs(args.spec, sys.stderr)
        observed: dict[str, ObservedSlot] | None = None
        digest: str | None = args.image_digest
        notes: list[str] = []
        if args.state_dir is not None:
            stored = load_slot_state(args.state_dir / SLOT_STATE_FILE)
            if args.backend:
                market = make_marketplace(args, args.state_dir)
                # The secret only mints tokens at create time; plan never creates.
                observed = SlotProvider(market, b"plan-creates-nothing").observe(stored)
                digest = resolve_image(args.backend, args.image, args.image_digest, spec, args.state_dir).digest
            else:
                observed = {s: o.observed() for s, o in stored.items()}
                notes.append("no --backend given: slot statuses as the last apply recorded them")
        if digest is None:
            notes.append("desired image digest unknown (give --image/--image-digest): image changes not planned")
    except ApplyError as exc:
        print(f"fleet plan: {exc}", file=sys.stderr)
        return 1
    except (SlotError, MarketplaceError) as exc:
        print(f"fleet plan: cannot observe the fleet: {describe_error(exc)}", file=sys.stderr)
        return 1

    now = args.at or datetime.now(UTC)
    slot_plan = plan(spec, observed or {}, records, digest, now) if observed is not None else None
    if observed is None:
        notes.insert(0, RECORDS_ONLY_NOTE)
    from reconciler.adapters.capacity_files import capacity_entries

    rows: list[dict[str, Any]] = []
    forecasts: list[PoolForecast] = []

    def plain() -> None:
        """The plan's own rows and forecasts (with --what-if: while the what-if's child finishes its replay)."""
        rows.extend(pool_rows(spec, records, observed, slot_plan, digest, now, capacity_entries(spec, args.spec)))
        forecasts.extend(fleet_forecast(spec, records, now))

    what_if = None
    if args.what_if:
        from reconciler.flows.whatif import WhatIfError, what_if_of_repo
        from reconciler.render.whatif import Header

        try:
            result, inputs = what_if_of_repo(args.spec, args.base, args.since, now, meanwhile=plain)
        except WhatIfError as exc:
            print(f"fleet plan --what-if: {exc}", file=sys.stderr)
            return 1
        what_if = (result, Header(str(args.spec), args.base, inputs.base_sha))
    else:
        plain()
    all_notes = notes + list(slot_plan.notes if slot_plan else pause_notes(spec, records, digest, now))
    cap_note = spend_cap_note(spec)
    if cap_note is not None and not any("spend cap" in n for n in all_notes):
        all_notes.append(cap_note)
    output = "json" if args.json else (args.format or "text")
    if output == "markdown":
        actions = ([{"kind": a.kind, "slot": a.slot, "reason": a.reason, "detail": a.detail}
                    for a in slot_plan.actions] if slot_plan else None)
        sys.stdout.write(render_plan_markdown(pools=rows, actions=actions, forecasts=forecasts, image_digest=digest,
                                              notes=all_notes, record_problems=records.problems))
        if what_if is not None:
            from reconciler.render.whatif import render_whatif_markdown

            sys.stdout.write("\n" + render_whatif_markdown(*what_if))
        return 0
    if output == "json":
        doc: dict[str, Any] = {
            "spec": str(args.spec), "records_only": observed is None, "image_digest": digest, "pools": rows,
            "actions": [asdict(a) for a in slot_plan.actions] if slot_plan else [],
            "converged": slot_plan.converged if slot_plan else None, "notes": all_notes,
            "max_total_dph": spec.max_total_dph,
            "spend_cap_held": [a.slot for a in slot_plan.capped] if slot_plan else [],
            "record_problems": list(records.problems),
            "forecast": [{**asdict(f), "slo_proofs_per_hour": f.slo_proofs_per_hour,
                          "cap_usd_per_hour": f.cap_usd_per_hour, "meets_slo": f.meets_slo} for f in forecasts]}
        if what_if is not None:
            from reconciler.render.whatif import whatif_json

            doc["what_if"] = whatif_json(*what_if)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print_table(rows)
    if slot_plan:
        for action in slot_plan.actions:
            if action.kind != "keep" or action.reason:
                detail = f"{action.reason}: {action.detail}" if action.detail else action.reason
                print(f"  {action.kind:<7} {action.slot:<20} {detail}")
        if slot_plan.converged:
            print("no changes: slots match the spec")
    for note in all_notes:
        print(f"note: {note}")
    if what_if is not None:
        from reconciler.render.whatif import render_whatif_text

        print()
        sys.stdout.write(render_whatif_text(*what_if))
    return 0


def pause_notes(spec: FleetSpec, records: RecordSet, digest: str | None, now: datetime) -> list[str]:
    out = []
    for pool in spec.pools:
        pause = pool_pause(pool.name, records, digest)
        if pause:
            out.append(pause.describe(now))
    if digest is None:
        for suspect in records.suspect_images().values():
            pools = ", ".join(suspect.pools) or "every pool"
            out.append(f"image {short_digest(suspect.image_digest)} is suspect ({suspect.signature!r}): "
                       f"{pools} paused while it is the desired image")
    return out


def pool_rows(spec: FleetSpec, records: RecordSet, observed: dict[str, ObservedSlot] | None,
              slot_plan: SlotPlan | None, digest: str | None, now: datetime,
              capacity: Mapping[str, CapacityEntry] | None = None) -> list[dict[str, Any]]:
    """Per pool: desired vs running, the machines of its GPU model the records exclude at `now` (bad, permanent,
    banned, unreadable) and those on probation (rentable again), as `fleet records` shows them; an autoscaled
    pool's bounds and, with `queue.market`, the Snark Market figures of the leader's last decision
    (capacity.yaml)."""
    bad = records.bad_machine_ids(now)
    on_probation = [b for b, standing in records.standings(now, passed_on_probation=True)
                    if standing.state == "probation"]
    rows = []
    gpu_of = records.bad_machine_gpus()  # unreadable ones: unknown GPU
    for pool in spec.pools:
        bad_known = sorted(m for m in bad if gpu_of.get(m) in (None, pool.gpu_name))
        probation_known = [b.machine_id for b in on_probation if b.gpu_name in (None, pool.gpu_name)]
        running = None
        if observed is not None:
            running = sum(1 for o in observed.values() if o.pool == pool.name and o.status in ("running", "loading"))
        actions: Counter[str] = Counter()
        if slot_plan:
            actions.update(a.kind for a in slot_plan.actions if a.pool == pool.name and a.kind != "keep")
        rows.append({
            "pool": pool.name, "gpu": pool.gpu_name, "desired": pool.count, "running": running,
            "bad_machines_known": len(bad_known), "probation_known": len(probation_known),
            "paused": pool_pause(pool.name, records, digest) is not None,
            "actions": dict(sorted(actions.items())),
        })
        if pool.min_count is not None:  # autoscaled: the bounds and what they may cost (the PR comment shows it)
            low, high = pool.bounds
            scaled: dict[str, Any] = {
                "min": low, "max": high, "desired": pool.desired_count,
                "usd_per_hour_at_min": round(low * pool.max_price_usd_per_hour, 2),
                "usd_per_hour_at_max": round(high * pool.max_price_usd_per_hour, 2),
                "target_utilization": pool.scaling.target_utilization if pool.scaling else None,
                "queue": list(pool.queue.task_types) if pool.queue else None}
            rows[-1]["autoscaled"] = scaled
            entry = (capacity or {}).get(pool.name)
            if pool.queue is not None and pool.queue.market is not None:
                figures = entry.signals.get("market") if entry is not None else None
                scaled["market"] = {
                    **economics_from_json(figures if isinstance(figures, Mapping) else {}),
                    "min_margin": pool.queue.market.min_margin,
                    "as_of": format_time(entry.changed_at) if entry is not None and entry.changed_at else None}
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("POOL", "GPU", "DESIRED", "RUNNING", "BAD KNOWN", "PROBATION", "PAUSED", "ACTIONS")
    lines = [header]
    for r in rows:
        acts = ", ".join(f"{k} {v}" for k, v in r["actions"].items()) or "-"
        lines.append((r["pool"], r["gpu"], str(r["desired"]), "?" if r["running"] is None else str(r["running"]),
                      str(r["bad_machines_known"]), str(r["probation_known"]), "yes" if r["paused"] else "no", acts))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
