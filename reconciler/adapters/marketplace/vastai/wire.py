"""vast.ai's wire format: request bodies, response parsing, and the client-side checks of what we send.

Pure (no HTTP): the client (`client.py`) sends what these build and reads replies through them. Facts in the
package docstring (`reconciler.adapters.marketplace.vastai`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

from reconciler.domain.marketplace import (
    Instance,
    InstanceRequest,
    Offer,
    OfferList,
    OfferQuery,
    PermanentMarketplaceError,
)

log = logging.getLogger(__name__)

#: vast rejects longer onstart scripts.
ONSTART_MAX_CHARS = 4048
#: vast's CLI converts `cpu_ram` GB -> MB with this factor (offers_mult), so do we.
CPU_RAM_MB_PER_GB = 1000.0
#: "args" runs the image's own entrypoint (our worker); "ssh"/"jupyter" would replace it with vast's.
DEFAULT_RUNTYPE = "args"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters that mean the same thing to docker, a shell and vast's env handling: no quotes, `$`,
# backslashes, tabs/newlines or separators. Plain spaces are allowed: GPU names have them ("RTX 4090"),
# and a value with spaces but no quotes can always be single-quoted. Our values (URLs, hex tokens,
# digests, numbers, names) fit in it.
_ENV_VALUE = re.compile(r"[A-Za-z0-9_./:@%+=,~ -]*")
_NUMERIC_ID = re.compile(r"[0-9]{1,19}")

#: vast `actual_status` -> ours (base.INSTANCE_STATUSES). `None` (no status yet) is "loading" too.
_STATUS_MAP = {
    "created": "loading",
    "loading": "loading",
    "scheduling": "scheduling",
    "running": "running",
    "rebooting": "rebooting",
    "frozen": "frozen",
    "stopped": "stopped",
    "exited": "exited",
    "offline": "offline",
    "unknown": "unknown",
}



def _id_value(machine_id: str) -> int | str:
    """vast's machine ids are integers; a filter on a string would not match them."""
    return int(machine_id) if _NUMERIC_ID.fullmatch(machine_id) else machine_id


def build_search_body(query: OfferQuery) -> dict[str, Any]:
    """OfferQuery -> the `POST /bundles/` body. Ranking is the planner's: we only ask for cheapest first."""
    body: dict[str, Any] = {
        "gpu_name": {"eq": query.gpu_name},
        "num_gpus": {"eq": query.num_gpus},
        "dph_total": {"lte": query.max_price_usd_per_hour},
        "reliability": {"gte": query.min_reliability},
        "inet_down": {"gte": query.min_inet_down_mbps},
        "disk_space": {"gte": query.min_disk_gb},
        "cpu_ram": {"gte": query.min_cpu_ram_gb * CPU_RAM_MB_PER_GB},
        "cuda_max_good": {"gte": query.min_cuda},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        # "external" offers are listings outside vast's own scheduling; the CLI excludes them by default.
        "external": {"eq": False},
    }
    if query.verified_only:
        body["verified"] = {"eq": True}
    if query.exclude_machine_ids:
        body["machine_id"] = {"notin": [_id_value(m) for m in sorted(query.exclude_machine_ids)]}
    if query.min_disk_gb > 0:
        # Prices our disk into dph_total, so the price cap compares what we would really pay.
        body["allocated_storage"] = query.min_disk_gb
    body["order"] = [["dph_total", "asc"]]
    body["limit"] = query.limit
    body["type"] = "on-demand"
    return body


def _number(raw: Mapping[str, Any], key: str, default: float | None = None) -> float:
    value = raw.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"missing {key}")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{key} is not a number: {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{key} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{key} is not finite: {value!r}")
    return number


def _ident(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if isinstance(value, bool) or value is None:
        raise ValueError(f"missing {key}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError(f"{key} is not an id: {value!r}")


def _optional_text(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) and value else None


def parse_offer(raw: Any) -> Offer:
    """One element of `offers` -> Offer. Raises ValueError naming the bad field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"offer is not an object: {type(raw).__name__}")
    gpu_name = raw.get("gpu_name")
    if not isinstance(gpu_name, str) or not gpu_name:
        raise ValueError("missing gpu_name")
    reliability_key = "reliability" if raw.get("reliability") is not None else "reliability2"
    verified = raw.get("verified")
    if not isinstance(verified, bool):
        verified = raw.get("verification") == "verified"
    num_gpus = _number(raw, "num_gpus")
    if not num_gpus.is_integer() or num_gpus < 1:
        raise ValueError(f"num_gpus is not a positive integer: {raw.get('num_gpus')!r}")
    return Offer(
        offer_id=_ident(raw, "id"),
        machine_id=_ident(raw, "machine_id"),
        host_id=_ident(raw, "host_id"),
        gpu_name=gpu_name,
        num_gpus=int(num_gpus),
        price_usd_per_hour=_number(raw, "dph_total"),
        # An offer that does not state its reliability is treated as unreliable, not as perfect.
        reliability=_number(raw, reliability_key, 0.0),
        inet_down_mbps=_number(raw, "inet_down", 0.0),
        disk_gb=_number(raw, "disk_space", 0.0),
        cpu_ram_gb=_number(raw, "cpu_ram", 0.0) / CPU_RAM_MB_PER_GB,
        cuda_max_good=_number(raw, "cuda_max_good", 0.0),
        verified=verified,
        geolocation=_optional_text(raw, "geolocation"),
    )

def raw_refusal(raw: Mapping[str, Any]) -> str | None:
    """Why a row is not for rent whatever the pool wants (None: it is), from raw fields the port does not carry.

    Whether an offer FITS a pool is decided once, by `reconciler.domain.ranking` (the slot provider ranks what
    this adapter returns); the server-side filters of `build_search_body` are only a pre-filter."""
    if raw.get("rentable") is False:
        return "not rentable"
    # `rented` is no server-side filter: the server drops the key and the official CLI filters the rows itself, a
    # missing or null `rented` counting as False (vast-ai/vast-cli vast.py search__offers, "if 'rented' in query"
    # after the POST, @55679830a2c2adcf5c7fad08bf08717a9591062a).
    if raw.get("rented") is True:
        return "already rented"
    return None


def parse_offers(payload: Any) -> OfferList:
    """The `/bundles/` response -> the offers for rent, in the API's order (fit is the ranking's to decide).

    A malformed offer is skipped with a warning: one bad listing must not hide the rest of the market.
    A response without an `offers` list is unusable as a whole: ValueError. `truncated: true` (the server cut
    its answer short) is carried on the result: what it lacks may fit, so it is never read as complete.
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("offers"), list):
        raise ValueError("response has no 'offers' list")
    offers: list[Offer] = []
    seen: set[str] = set()
    dropped = 0
    for index, raw in enumerate(payload["offers"]):
        try:
            offer = parse_offer(raw)
        except ValueError as exc:
            log.warning("vast.ai: skipping malformed offer #%d: %s", index, exc)
            dropped += 1
            continue
        reason = raw_refusal(raw)
        if reason is not None:
            log.info("vast.ai: dropping offer %s on machine %s: %s", offer.offer_id, offer.machine_id, reason)
            dropped += 1
            continue
        if offer.offer_id in seen:
            continue
        seen.add(offer.offer_id)
        offers.append(offer)
    truncated = payload.get("truncated") is True
    if truncated:
        log.info("vast.ai: the search answer was truncated (%d offers returned, %d kept): not the whole market",
                 len(payload["offers"]), len(offers))
    return OfferList(offers, truncated=truncated, dropped=dropped)


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """Validate the worker env. Errors name the variable, never its value (it may be the token)."""
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            # A name such as "-v /:/host" would be read by vast as a docker flag, not a variable.
            raise PermanentMarketplaceError(f"env: {name!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise PermanentMarketplaceError(f"env: value of {name} is a {type(value).__name__}, not a string")
        bad = sorted({ch for ch in value if not _ENV_VALUE.fullmatch(ch)})
        if bad:
            shown = ", ".join(repr(ch) for ch in bad[:5])
            raise PermanentMarketplaceError(
                f"env: value of {name} contains characters that are unsafe in a docker/shell env ({shown}); "
                "allowed: letters, digits, spaces and _ . / : @ % + = , ~ -"
            )
        checked[name] = value
    return checked


def docker_env_flags(env: Mapping[str, str]) -> str:
    """The same env in vast's CLI/GUI form ("-e K=V -e K2='V 2'"), for templates and humans.

    Values passed `check_env` (no quotes in them), so single quotes around those with spaces suffice.
    """
    return " ".join(
        f"-e {name}='{value}'" if " " in value else f"-e {name}={value}" for name, value in check_env(env).items()
    )


def build_create_body(request: InstanceRequest, runtype: str = DEFAULT_RUNTYPE) -> dict[str, Any]:
    """InstanceRequest -> the `PUT /asks/{id}/` body. Raises PermanentMarketplaceError on bad input."""
    if not request.image:
        raise PermanentMarketplaceError("create: image is empty")
    if not request.label:
        raise PermanentMarketplaceError("create: label is empty (it is how we find our instance again)")
    if request.disk_gb <= 0:
        raise PermanentMarketplaceError(f"create: disk_gb must be positive, got {request.disk_gb}")
    if request.onstart is not None and len(request.onstart) > ONSTART_MAX_CHARS:
        raise PermanentMarketplaceError(
            f"create: onstart is {len(request.onstart)} characters; vast.ai accepts at most {ONSTART_MAX_CHARS}"
        )
    body: dict[str, Any] = {
        "client_id": "me",
        "image": request.image,
        "disk": request.disk_gb,
        "label": request.label,
        "env": check_env(request.env),
        "runtype": runtype,
    }
    if request.onstart is not None:
        body["onstart"] = request.onstart
    if request.image_login is not None:
        body["image_login"] = request.image_login
    return body


def normalise_status(actual_status: Any) -> str:
    """vast's `actual_status` -> one of base.INSTANCE_STATUSES."""
    if actual_status is None:
        # A fresh contract reports no status until its machine picks it up.
        return "loading"
    if not isinstance(actual_status, str):
        return "unknown"
    return _STATUS_MAP.get(actual_status.strip().lower(), "unknown")


def parse_instance(raw: Any) -> Instance:
    """One instance row (v0 or v1 shape) -> Instance. Raises ValueError naming the bad field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"instance is not an object: {type(raw).__name__}")
    label = raw.get("label")
    price = raw.get("dph_total")
    start = raw.get("start_date")
    return Instance(
        contract_id=_ident(raw, "id"),
        label=label.strip() if isinstance(label, str) and label.strip() else None,
        machine_id=_ident(raw, "machine_id"),
        host_id=_ident(raw, "host_id"),
        status=normalise_status(raw.get("actual_status")),
        gpu_name=_optional_text(raw, "gpu_name"),
        price_usd_per_hour=_number(raw, "dph_total") if price is not None else None,
        image=_optional_text(raw, "image_uuid"),
        status_msg=_optional_text(raw, "status_msg"),
        start_date=_number(raw, "start_date") if start is not None else None,
    )


def api_message(payload: Any) -> str | None:
    if isinstance(payload, Mapping):
        for key in ("msg", "error", "detail", "message"):
            value = payload.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
    return None
