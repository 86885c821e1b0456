"""Identifiers by full match (issue 14 item 4): machine, instance, pool and image digest with a trailing
newline (`"73100\\n"`: `$` matches before it) are refused at the API edge, on load and in the CLI; a report
that cannot be judged is quarantined with its reason and the others are judged in the same pass, through the
real SQLite store and a real git origin."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.adapters.controller.protocol import INSTANCE_ID
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.record_files import load_records
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.identifiers import IMAGE_REF_DIGEST, SAFE_ID, identifier_problems, is_identifier
from reconciler.domain.records import RecordError, check_image_digest, check_machine_id
from reconciler.domain.tokens import is_well_formed_token
from reconciler.flows.judge import run_pass
from tests.controller_support import Harness, auth, register_doc
from tests.fakes import Sleeps
from tests.gitrepos import git, make_origin, origin_file
from tests.scenarios import SPEC_YAML, T0

NEWLINE_IDS = ["73100\n", "73100\r\n", "\n73100", "731\n00", "73100 ", ""]


@pytest.mark.parametrize("bad", NEWLINE_IDS)
def test_every_identifier_check_is_a_full_match(bad: str) -> None:
    with pytest.raises(RecordError):
        check_machine_id(bad)
    with pytest.raises(RecordError):
        check_image_digest("sha256:" + "ab" * 32 + bad if bad else "")
    assert INSTANCE_ID.fullmatch(bad) is None and not is_identifier(SAFE_ID, bad)
    assert not is_well_formed_token("ab" * 32 + "\n")
    assert not is_identifier(IMAGE_REF_DIGEST, "repo@sha256:" + "ab" * 32 + "\n")
    assert is_identifier(IMAGE_REF_DIGEST, "registry.example/worker@sha256:" + "ab" * 32)
    assert check_machine_id("73100") == "73100"


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "controller.db")
    yield harness
    harness.close()


@pytest.mark.parametrize(("field", "value"), [
    ("machine_id", "73100\n"), ("host_id", "77\n"), ("contract_id", "9001\n"), ("pool", "rtx4090\n"),
    ("slot", "rtx4090-0\n"), ("image_digest", "sha256:" + "ab" * 32 + "\n"), ("machine_id", "../../etc"),
])
def test_register_with_an_identifier_that_only_matches_up_to_a_newline_is_400(h: Harness, field: str,
                                                                               value: str) -> None:
    iid = "p-0-ident0"
    doc = {**register_doc(iid), field: value}
    if field == "machine_id":
        doc.pop("machine_claim")  # the claim is checked after the identifiers; the id itself is refused
    r = h.client.post(f"/api/v1/instances/{iid}/register", content=json.dumps(doc),
                      headers={**auth(iid), "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    problems = r.json()["detail"]
    assert any(p["path"] == f"$.{field}" and "matched in full" in p["message"] for p in problems), problems
    assert h.store.stats()["instances"] == 0
    assert h.client.post(f"/api/v1/instances/{iid}%0A/register", json=register_doc(iid),
                         headers=auth(iid)).status_code == 400
    assert identifier_problems({field: value})


def inject_raw_instance(db: Path, instance_id: str, machine_id: str, *, corrupt_event: bool = False) -> None:
    """Write a row the way an older controller (or a hand edit) could have: bypassing the API's checks."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO instances (instance_id, received_at, worker_at, pool, slot, machine_id, host_id) "
                     "VALUES (?, ?, ?, 'rtx4090', 'rtx4090-9', ?, '1')",
                     (instance_id, T0.isoformat(), T0.isoformat(), machine_id))
        if corrupt_event:
            conn.execute("INSERT INTO events (instance_id, phase, status, at, received_at, log_tail, details, "
                         "fingerprint) VALUES (?, 'params', 'failed', 'not a time', ?, '[]', '{', 'x')",
                         (instance_id, T0.isoformat()))
    conn.close()


def worker_posts(h: Harness, iid: str, machine: str, rate: float) -> None:
    """A real worker's whole benchmark over HTTP: register, phases, a completed result."""
    doc = register_doc(iid)
    from reconciler.domain.tokens import machine_claim
    from tests.controller_support import SECRET
    doc.update(machine_id=machine, machine_claim=machine_claim(SECRET, iid, machine))
    assert h.post(iid, "register", doc).status_code == 200
    for phase, status, at in [("params", "done", "18:10:00"), ("benchmark", "started", "18:20:00")]:
        assert h.post(iid, "events", {"protocol": 1, "phase": phase, "status": status,
                                      "at": f"2026-12-02T{at}Z"}).status_code == 200
    spp = 3600 / rate
    assert h.post(iid, "result", {
        "protocol": 1, "outcome": "completed", "at": "2026-12-02T18:40:00Z", "started_at": "2026-12-02T18:20:00Z",
        "exit_code": 0, "requested": 10, "completed": 10, "failed": 0, "proofs_per_hour": rate,
        "seconds_per_proof": spp, "proof_type": "porep", "concurrency": 2,
        "log_tail": ["=== Batch Summary ===", f"throughput:    {60 / spp:.3f} proofs/min ({spp:.1f}s/proof)"]},
    ).status_code == 200


def test_a_report_that_cannot_be_judged_is_quarantined_and_never_stalls_the_others(tmp_path: Path) -> None:
    bare, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    git(tmp_path, "clone", "--quiet", str(bare), str(tmp_path / "bot"))
    bot = GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(1), max_attempts=2)
    h = Harness(tmp_path / "controller.db")
    try:
        worker_posts(h, "rtx4090-0-good01", "41001", 20.0)  # below the pool's 40/h: a real verdict
        inject_raw_instance(h.path, "rtx4090-9-bad001", "73100\n")
        inject_raw_instance(h.path, "rtx4090-8-bad002", "73101", corrupt_event=True)
        store = SqliteStore(h.path)
        now = T0 + timedelta(hours=3)
        for attempt in range(2):  # and again: the quarantine does not wedge later passes either
            result = run_pass(GitFleetTree(bot), store, now + timedelta(minutes=attempt))
            assert result.ok, result.headline()
            notes = "\n".join(result.notes)
            assert "rtx4090-9-bad001" in notes and "'73100\\n'" in notes and "not a valid id" in notes
            assert "rtx4090-8-bad002: quarantined, not judged: stored report unreadable" in notes
        store.close()
        record = origin_file(bare, "fleet-spec/machines/41001.yaml")
        assert record is not None and "below-min-rate" in record
        git(tmp_path / "bot", "pull", "--quiet")
        loaded = load_records(tmp_path / "bot" / "fleet-spec")
        assert set(loaded.machines) == {"41001"} and not loaded.problems
        assert not list((tmp_path / "bot" / "fleet-spec" / "machines").glob("73100*"))
    finally:
        h.close()


def test_a_record_file_whose_name_is_not_a_full_id_is_reported_unreadable(tmp_path: Path) -> None:
    machines = tmp_path / "fleet-spec" / "machines"
    machines.mkdir(parents=True)
    (machines / "73100\n.yaml").write_text("machine_id: '73100\n'\nstatus: bad\nbenchmarks: []\n")
    loaded = load_records(tmp_path / "fleet-spec")
    assert "73100\n" not in loaded.machines
