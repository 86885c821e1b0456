"""Small helpers several commands share, kept apart so a light command (`fleet status`) does not import a
heavy one (`fleet reconcile` pulls in git and the judging flow)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from reconciler.adapters.settings import settings
from reconciler.domain.records import check_image_digest


def last_pass_path(workdir: Path) -> Path:
    """Beside the clone, not in it: the bot's work tree holds only what git tracks."""
    workdir = Path(workdir)
    return workdir.parent / f"{workdir.name}.last-pass.json"


def desired_digest_arg(value: str | None) -> str | None:
    """--image-digest, else $FLEET_IMAGE_DIGEST, else None (stale-image checks off)."""
    value = value if value is not None else settings().image_digest
    return check_image_digest(value) if value else None


def instant(text: str) -> datetime:
    """A time argument (`--at`, `--since`): an ISO 8601 time with its zone, as UTC."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an ISO 8601 time (e.g. 2026-12-02T22:00:00Z)") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give the time zone (Z for UTC)")
    return value.astimezone(UTC)
