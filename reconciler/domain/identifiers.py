"""Identifiers that end up in file names, git trailers, SQL keys and URLs: machine, instance, pool, slot, host
and contract ids and image digests, checked where they enter (the controller API, record files, the CLI).

Every check is a FULL match (`Pattern.fullmatch`, and the patterns end in `\\Z`): with `re.match` and `$`,
`$` also matches before a trailing newline, which once let machine id "73100\\n" into the store and stalled
the judging of every machine. JSON Schema `pattern`s are searched the same way by the jsonschema package,
so the controller repeats these checks after the schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
#: What workers report as their image: a digest, or a repository pinned by digest (`repo@sha256:...`).
IMAGE_REF_DIGEST = re.compile(r"(?:[a-z0-9][a-z0-9._/:-]{0,255}@)?sha256:[0-9a-f]{64}\Z")

_SAFE = "[A-Za-z0-9][A-Za-z0-9_.-]*, at most 64 characters, no '..'"
#: Identifier fields of worker reports: field -> (pattern, what is expected).
REPORT_IDENTIFIERS: dict[str, tuple[re.Pattern[str], str]] = {
    "machine_id": (SAFE_ID, _SAFE),
    "host_id": (SAFE_ID, _SAFE),
    "contract_id": (SAFE_ID, _SAFE),
    "pool": (SAFE_ID, _SAFE),
    "slot": (INSTANCE_ID, "[A-Za-z0-9][A-Za-z0-9_.-]*, at most 128 characters, no '..'"),
    "image_digest": (IMAGE_REF_DIGEST, "sha256:<64 hex> or <repository>@sha256:<64 hex>"),
}


def is_identifier(pattern: re.Pattern[str], value: object) -> bool:
    """True when `value` is a string that `pattern` matches in full and that holds no '..'."""
    return isinstance(value, str) and pattern.fullmatch(value) is not None and ".." not in value


def identifier_problems(doc: Mapping[str, Any]) -> list[dict[str, str]]:
    """[{path, message}] for every identifier field of a report that is present, not null and not valid."""
    problems = []
    for field, (pattern, expected) in REPORT_IDENTIFIERS.items():
        value = doc.get(field)
        if value is not None and not is_identifier(pattern, value):
            problems.append({"path": f"$.{field}",
                             "message": f"{str(value)[:80]!r} is not a valid {field.replace('_', ' ')} "
                                        f"(expected {expected}, matched in full)"})
    return problems
