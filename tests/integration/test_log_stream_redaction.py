"""A private key printed across two log batches is masked whole, on both store adapters and across replicas:
the state of an instance's log stream (inside a key block, how many lines in) is a column of its row, read and
written in the batch's transaction, so the batch after arrives at any replica and is redacted as the key's
continuation (issue 30: the last line of a PEM key split across two batches reached git)."""

from __future__ import annotations

import pytest

from reconciler.domain.redact import MASK
from tests.controller_support import register_doc
from tests.store_support import StoreFactory

KEY_LAST_LINE = "Q7hostileKeyLastLine0123=="


@pytest.mark.parametrize("store_factory", ["sqlite", "postgres"], indirect=True)
def test_a_key_split_across_batches_is_masked_whole_on_any_replica(store_factory: StoreFactory) -> None:
    first, second = store_factory("fleet"), store_factory("fleet")  # two replicas of one store
    first.register("p-0-key001", register_doc("p-0-key001"))
    first.add_logs("p-0-key001", ["writing key", "-----BEGIN OPENSSH PRIVATE KEY-----",
                                  "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAABlwAAAAdzc2gtcn"])
    second.add_logs("p-0-key001", [KEY_LAST_LINE, "-----END OPENSSH PRIVATE KEY-----", "key written", "token=abc"])
    second.add_logs("p-0-key001", ["after the key: shown"])
    assert first.tail("p-0-key001", 100) == [
        "writing key", "-----BEGIN PRIVATE KEY----- [REDACTED]", MASK, MASK, "-----END PRIVATE KEY-----",
        "key written", f"token={MASK}", "after the key: shown"]
    assert KEY_LAST_LINE not in store_factory.raw_text("fleet")
