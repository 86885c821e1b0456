"""Numbers read back from JSON documents (the pass's market and capacity files, recorded evidence): what a
document holds where a number is expected is a number, or it is unknown. Shared by every domain reader of such
documents and by the adapters that read them."""

from __future__ import annotations


def json_number(value: object) -> float | None:
    """`value` as a float when JSON would call it a number; None otherwise (Python's bool is an int, not a number)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
