"""Reads the provisioner's view of the market (`<state dir>/market.json`, written by `fleet apply` after its
orphan sweep: the fleet's spend cap, the orphans it found with their $/h) for the live status page. A missing
file is an empty view (no apply ran here yet); an unreadable one raises, and the page lists that as a problem.
"""

from __future__ import annotations

import json
from pathlib import Path

from reconciler.domain.json_numbers import json_number
from reconciler.domain.surfaces import MarketView, Orphan

MARKET_VIEW_FILE = "market.json"


def read_market_view(state_dir: Path) -> MarketView:
    path = state_dir / MARKET_VIEW_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return MarketView()
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object")
    orphans = []
    for item in doc.get("orphans") or []:
        if not isinstance(item, dict) or not item.get("contract_id"):
            continue
        price = json_number(item.get("price_usd_per_hour"))
        detail = ", ".join(part for part in (
            str(item.get("kind") or ""), str(item.get("why") or ""),
            f"machine {item['machine_id']}" if item.get("machine_id") else "",
            f"${price:.2f}/h" if price is not None else "",
            "due for destruction" if item.get("due") else "within its grace period") if part)
        orphans.append(Orphan(str(item["contract_id"]), str(item.get("label") or "") or None,
                              "due" if item.get("due") else "found", detail))
    return MarketView(tuple(orphans), json_number(doc.get("max_total_dph")),
                      json_number(doc.get("orphans_usd_per_hour")) or 0.0,
                      str(doc.get("at")) if doc.get("at") else None)
