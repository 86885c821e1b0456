"""The worker protocol v1 grew per-proof results, a warm-up phase, the daemon's filtered log and the memory
budget (issue 13). The additions are optional: what older workers send must stay valid, and the new fields
must refuse what no worker may send."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from reconciler import SCHEMA_DIR
from reconciler.adapters.store.sqlite import SqliteStore

SCHEMA = json.loads((SCHEMA_DIR / "worker-protocol.v1.schema.json").read_text(encoding="utf-8"))


def validator(kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{kind}"})


OLD_RESULT: dict[str, Any] = {
    "protocol": 1, "outcome": "completed", "at": "2026-12-02T18:30:00Z", "started_at": "2026-12-02T18:00:00Z",
    "exit_code": 0, "requested": 10, "completed": 10, "failed": 0, "proofs_per_hour": 38.5,
    "seconds_per_proof": 93.5, "proof_type": "porep", "concurrency": 1, "image_digest": None,
    "log_tail": ["  [1/10] ok — 93.4s (prove=41234 ms, queue=0 ms)"]}

NEW_RESULT: dict[str, Any] = {
    **OLD_RESULT, "completed": 8, "failed": 2,
    "proofs": [{"index": 1, "label": "COMPLETED", "seconds": 93.4, "prove_ms": 41234, "queue_ms": 0,
                "request_id": "5b0c3c8e-8f7e-4d8e-9c53-0d4c1f1c2a10", "reason": None},
               {"index": 2, "label": "FAILED", "seconds": 88.0, "prove_ms": 0, "queue_ms": 0,
                "request_id": None,
                "reason": "PoRep proof self-check failed: assembled proof did not verify (sector=1, miner=1000)"}],
    "warmup": {"outcome": "completed", "preload_seconds": 51.2, "preload_already_loaded": False,
               "seconds": 301.7, "label": "COMPLETED", "reason": None},
    "warmup_seconds": 352.9,
    "daemon_log_tail": ["cuzk-daemon: 2026-12-02T18:01:00.000000Z ERROR cuzk_core::engine: Phase 7: PoRep proof "
                        "self-check FAILED — proof will NOT be returned to caller"],
    "memory": {"budget_bytes": 118 * 2**30, "source": "cgroup-v2", "limit_bytes": 128 * 2**30,
               "host_total_bytes": 512 * 2**30},
    "sector_num": 1, "miner_id": 1000}


def test_a_result_from_an_older_worker_stays_valid() -> None:
    validator("result").validate(OLD_RESULT)


def test_a_result_with_every_addition_is_valid() -> None:
    validator("result").validate(NEW_RESULT)


@pytest.mark.parametrize("label", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN"])
def test_every_cuzk_bench_label_is_accepted(label: str) -> None:
    validator("result").validate({**NEW_RESULT, "proofs": [{"index": 1, "label": label}]})


@pytest.mark.parametrize(("field", "value", "where"), [
    ("proofs", [{"index": 1, "label": "ok"}], "label"),           # workers translate `ok` to COMPLETED
    ("proofs", [{"index": 0, "label": "FAILED"}], "index"),       # [i/N] is 1-based
    ("proofs", [{"index": 1, "label": "FAILED", "why": "x"}], "why"),
    ("warmup", {"outcome": "warm"}, "outcome"),
    ("memory", {"budget_bytes": 1, "source": "guess"}, "source"),
    ("memory", {"budget_bytes": -1, "source": "spec"}, "budget_bytes"),
    ("sector_num", -1, "sector_num"),
    ("daemon_log_tail", ["x" * 4097], "daemon_log_tail"),
])
def test_bad_additions_are_refused_naming_the_field(field: str, value: Any, where: str) -> None:
    errors = list(validator("result").iter_errors({**NEW_RESULT, field: value}))
    assert errors, f"{field}={value!r} should be refused"
    assert any(where in "/".join(str(p) for p in e.absolute_path) or where in e.message for e in errors)


def test_warmup_is_a_phase_between_daemon_and_benchmark() -> None:
    phases = SCHEMA["$defs"]["event"]["properties"]["phase"]["enum"]
    assert phases.index("daemon") < phases.index("warmup") < phases.index("benchmark")
    validator("event").validate({"protocol": 1, "phase": "warmup", "status": "done", "at": "2026-12-02T18:05:00Z",
                                 "details": {"preload_seconds": 51.2, "seconds": 301.7, "label": "COMPLETED"}})


def test_the_store_hands_proofs_and_the_daemon_log_to_judging(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db", now=lambda: datetime(2026, 12, 2, 18, 0, tzinfo=UTC))
    try:
        store.register("i-1", {"protocol": 1, "instance_id": "i-1", "at": "2026-12-02T17:59:00Z"})
        token = "hunter2-" + "x" * 24
        doc = {**NEW_RESULT, "daemon_log_tail": [*NEW_RESULT["daemon_log_tail"], f"cuzk-daemon: url https://u:{token}@h/"]}
        store.set_result("i-1", doc)
        report = store.report("i-1")
        assert report is not None and report.result is not None
        assert [(p.index, p.label, p.reason) for p in report.result.proofs] == [
            (1, "COMPLETED", None),
            (2, "FAILED", "PoRep proof self-check failed: assembled proof did not verify (sector=1, miner=1000)")]
        assert report.result.daemon_log[0].startswith("cuzk-daemon: ")
        assert token not in " ".join(report.result.daemon_log)  # redacted like every other evidence line
    finally:
        store.close()
