"""Many dynamic resources in one program: the SDK's serialize_provider nests a pickler wrapper per resource
(pulumi/dynamic/dynamic.py, 3.260-3.272) and raised RecursionError near the 488th; infra/hosts.py restores it."""

from __future__ import annotations

import pickle

from pulumi.dynamic.dynamic import serialize_provider

from infra.hosts import pickler_restored
from reconciler.adapters.pulumi_provider import SlotResourceProvider


def test_a_thousand_serialisations_leave_the_pickler_as_it_was() -> None:
    before = pickle._Pickler.__dict__.get("_batch_setitems")  # type: ignore[attr-defined]
    provider = SlotResourceProvider({"kind": "vastai", "pool_data_dir": "/x", "nested": {"b": 1, "a": [1, 2]}})
    blobs = set()
    for _ in range(1000):
        with pickler_restored():
            blobs.add(serialize_provider(provider))
    assert len(blobs) == 1  # deterministic: the same provider serialises the same way every time
    assert pickle._Pickler.__dict__.get("_batch_setitems") is before  # type: ignore[attr-defined]
