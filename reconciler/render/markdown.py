"""`fleet plan --format markdown`: the plan as one GitHub PR comment (posted or updated by .github/workflows/pr.yml,
found again by its first line, PLAN_MARKER).

A pure renderer of what `fleet plan` computed: the slot diff (per pool, and each action) and per pool the
forecast (reconciler/domain/forecast.py) of proofs/h and $/h against the SLO and the price cap, with its
warnings. Deterministic: no clock and no absolute paths, so a golden file can pin it. Every value from
records or the spec is escaped for Markdown tables (pipes, newlines, HTML).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.domain.forecast import PoolForecast

PLAN_MARKER = "<!-- gpu-fleet:plan -->"


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _code(value: Any) -> str:
    return f"`{_cell(value)}`" if value not in (None, "") else ""


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(row) + " |" for row in rows)]


def render_plan_markdown(*, pools: Sequence[Mapping[str, Any]], actions: Sequence[Mapping[str, Any]] | None,
                         forecasts: Sequence[PoolForecast], image_digest: str | None, notes: Sequence[str],
                         record_problems: Sequence[str] = ()) -> str:
    lines = [PLAN_MARKER, "## fleet plan", ""]
    lines.append(f"Desired image: {_code(image_digest) or '_unknown (image changes not planned)_'}")
    lines.append("")

    warned = [f for f in forecasts if f.warnings]
    if warned or record_problems:
        lines.append(f"> [!WARNING]\n> {len(warned)} pool(s) with warnings"
                     + (f", {len(record_problems)} unreadable record(s)" if record_problems else "")
                     + ": see below.")
        lines.append("")

    lines += ["### Slots", ""]
    rows = []
    for r in pools:
        acts = ", ".join(f"{k} {v}" for k, v in r["actions"].items()) or "-"
        rows.append([f"**{_cell(r['pool'])}**", _cell(r["gpu"]), str(r["desired"]),
                     "?" if r["running"] is None else str(r["running"]), str(r["bad_machines_known"]),
                     str(r["probation_known"]), "**yes**" if r["paused"] else "no", _cell(acts)])
    lines += _table(["pool", "GPU", "desired", "running", "bad known", "probation", "paused", "actions"], rows,
                    right=(2, 3, 4, 5))
    lines.append("")
    changes = [a for a in (actions or []) if a.get("kind") != "keep" or a.get("reason")]
    if actions is None:
        lines.append("_No slot state given: actions are not planned (records only)._")
    elif not changes:
        lines.append("No slot changes: the slots match the spec.")
    else:
        for a in changes:
            detail = f"{a.get('reason')}: {a['detail']}" if a.get("detail") else (a.get("reason") or "")
            lines.append(f"- `{_cell(a['kind'])}` **{_cell(a['slot'])}** {_cell(detail)}".rstrip())
    lines.append("")

    scaled = [r for r in pools if isinstance(r.get("autoscaled"), Mapping)]
    if scaled:
        lines += ["### Autoscaled pools", "",
                  "The leader keeps each count within its bounds from measured utilization and curio's queue "
                  "(decisions: `fleet-spec/capacity.yaml`); $/h at the pool's max price per slot.", ""]
        rows = []
        for r in scaled:
            a = r["autoscaled"]
            rows.append([f"**{_cell(r['pool'])}**", f"{a['min']}..{a['max']}", _cell(a.get("desired")),
                         f"${a['usd_per_hour_at_min']:.2f}", f"${a['usd_per_hour_at_max']:.2f}",
                         _num(a.get("target_utilization")),
                         _cell(", ".join(a["queue"])) if a.get("queue") else "utilization only"])
        lines += _table(["pool", "bounds", "desired now", "$/h at min", "$/h at max", "target utilization",
                         "queue"], rows, right=(2, 3, 4, 5))
        lines.append("")
        market = [r for r in scaled if isinstance(r["autoscaled"].get("market"), Mapping)]
        if market:
            lines += ["Snark Market work (curio's proofshare) counts as demand only while it pays more per proof "
                      "than the pool's own $/proof plus its margin; figures of the leader's last decision.", ""]
            rows = [_market_row(r["pool"], r["autoscaled"]["market"]) for r in market]
            lines += _table(["pool", "revenue $/proof", "$/proof", "break-even", "with margin", "market proofs served",
                             "counted", "as of"], rows, right=(1, 2, 3, 4, 5))
            lines.append("")

    lines += ["### Expected output and spend", "",
              "From the machines' own benchmark history: the best proven machines of each pool's GPU first; "
              "slots history cannot fill are counted at the GPU prior and at the price cap.", ""]
    rows = []
    for f in forecasts:
        verdict = {True: "meets SLO", False: "**below SLO**", None: "unknown"}[f.meets_slo]
        usd = f"${f.expected_usd_per_hour:.2f}" + (f" (at most: {f.priced_by_cap} priced at the cap)"
                                                    if f.priced_by_cap else "")
        basis = f"{f.measured} proven" + (f", {f.from_prior} at prior" if f.from_prior else "") + \
            (f", {f.unknown} unknown" if f.unknown else "") + \
            (f"; {f.below_min_known} known machine(s) below the minimum skipped" if f.below_min_known else "")
        rows.append([f"**{_cell(f.pool)}**", _num(f.expected_proofs_per_hour),
                     f"{_num(f.slo_proofs_per_hour)} ({f.desired} × {_num(f.min_rate_proofs_per_hour)})", verdict,
                     usd, f"${f.cap_usd_per_hour:.2f} ({f.desired} × ${f.max_price_usd_per_hour:.2f})", basis])
    lines += _table(["pool", "expected proofs/h", "SLO proofs/h", "vs SLO", "expected $/h", "cap $/h", "slots"], rows,
                    right=(1, 2, 4, 5))
    lines.append("")
    for f in warned:
        for w in f.warnings:
            lines.append(f"- :warning: **{_cell(f.pool)}**: {_cell(w)}")
    if warned:
        lines.append("")
    if notes or record_problems:
        lines += ["<details><summary>Notes</summary>", ""]
        lines += [f"- {_cell(n)}" for n in notes]
        lines += [f"- unreadable record (its machine is excluded from offers): {_cell(p)}" for p in record_problems]
        lines += ["", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def _market_row(pool: str, m: Mapping[str, Any]) -> list[str]:
    def usd(key: str) -> str:
        value = m.get(key)
        return f"${value:.3f}" if isinstance(value, int | float) else "?"

    served = m.get("served")
    counted = "tables unreadable" if m.get("error") else ("**yes** (pays)" if m.get("paying") else
                                                          "no (does not pay)")
    return [f"**{_cell(pool)}**", usd("revenue_usd_per_proof"), usd("usd_per_proof"),
            usd("break_even_usd_per_proof"), usd("threshold_usd_per_proof"),
            "?" if not isinstance(served, int) else str(served), counted, _cell(m.get("as_of") or "no decision yet")]
