"""The status table is ONE table: the planner's STATUS_RULES, and docs/vastai.md shows exactly it."""

from __future__ import annotations

from reconciler import REPO_ROOT
from reconciler.domain.marketplace import INSTANCE_STATUSES
from reconciler.domain.planner import (
    REASON_INSTANCE_DEAD,
    REASON_INSTANCE_STUCK,
    STATUS_RULES,
    replace_reason,
    status_verdict,
)


def test_every_marketplace_status_has_a_rule() -> None:
    assert set(STATUS_RULES) == set(INSTANCE_STATUSES)


def test_docs_show_the_table_the_code_uses() -> None:
    readme = (REPO_ROOT / "docs" / "vastai.md").read_text(encoding="utf-8")
    for rule in STATUS_RULES.values():
        assert f"| `{rule.status}` | {rule.meaning} | {rule.billing} | {rule.describe()} |" in readme


def test_deadlines_and_blame() -> None:
    assert status_verdict("running", 10**9) is None
    assert status_verdict("loading", 29 * 60) is None
    stuck = status_verdict("loading", 31 * 60)
    assert stuck is not None and stuck[0] == REASON_INSTANCE_STUCK and "machine is not blamed" in stuck[1]
    assert status_verdict("stopped", None) is not None and status_verdict("stopped", None)[0] == REASON_INSTANCE_DEAD  # type: ignore[index]
    assert status_verdict("frozen", None) is None  # no clock: only the at-once rules
    assert status_verdict("paused-by-a-new-vast-status", 11 * 60) is not None  # unknown statuses: as `unknown`
    # The status comes before the machine: a dead instance on a bad machine is replaced as dead, not blamed.
    assert replace_reason("m1", "d", "exited", {"m1"}, "d")[0] == REASON_INSTANCE_DEAD  # type: ignore[index]
