"""Directives over real HTTP and a real SQLite store: what the reconciler decided reaches the worker.

A v1 store (written before directives existed) is upgraded in place without losing data; GET
/api/v1/instances/{id}/directive needs the instance's own token and answers `wait` until a pass stored a
directive; the answer validates against the protocol schema's `directive`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from reconciler import SCHEMA_DIR
from reconciler.adapters.store.schema import SCHEMA_VERSION
from reconciler.adapters.store.sqlite import SqliteStore
from tests.controller_support import ADMIN_AUTH, T0, Harness, auth
from tests.store_support import sqlite_store_at


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "controller.db")
    yield h
    h.close()


def directive_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / "worker-protocol.v1.schema.json").read_text())
    return jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/directive"})


def test_directive_is_wait_until_a_pass_stores_one_then_what_it_stored(harness: Harness) -> None:
    harness.register("rtx4090-0-aa")
    url = "/api/v1/instances/rtx4090-0-aa/directive"
    first = harness.client.get(url, headers=auth("rtx4090-0-aa"))
    assert first.status_code == 200 and first.json()["action"] == "wait"
    stop = {"protocol": 1, "action": "stop", "verdict": "degraded", "reason": "degraded 20.0/h < 36.0/h",
            "heartbeat_s": 60.0}
    assert harness.store.set_directives({"rtx4090-0-aa": stop}, T0) == 1
    # The same directive again changes nothing (every pass rewrites them all).
    assert harness.store.set_directives({"rtx4090-0-aa": dict(stop)}, T0) == 0
    got = harness.client.get(url, headers=auth("rtx4090-0-aa")).json()
    assert got == {"protocol": 1, "action": "stop", "verdict": "degraded", "reason": "degraded 20.0/h < 36.0/h",
                   "heartbeat_s": 60.0, "at": "2026-12-02T18:00:00Z"}
    assert list(directive_validator().iter_errors(got)) == []
    assert list(directive_validator().iter_errors(first.json())) == []


def test_a_destroyed_instances_token_gets_stop_and_nothing_else(harness: Harness) -> None:
    """Issue 30: a worker token ends with its instance. Once the provisioner marked it destroyed, whatever the
    last pass decided (here `serve`), its directive is `stop` and its reports are refused."""
    harness.register("rtx4090-0-aa")
    harness.store.set_directives({"rtx4090-0-aa": {"protocol": 1, "action": "serve", "reason": "ok"}}, T0)
    url = "/api/v1/instances/rtx4090-0-aa/directive"
    assert harness.client.get(url, headers=auth("rtx4090-0-aa")).json()["action"] == "serve"
    destroyed = harness.client.post("/api/v1/instances/rtx4090-0-aa/destroyed", headers=ADMIN_AUTH)
    assert destroyed.status_code == 200
    got = harness.client.get(url, headers=auth("rtx4090-0-aa")).json()
    assert got["action"] == "stop" and got["reason"] == "instance destroyed"
    assert list(directive_validator().iter_errors(got)) == []
    logs = harness.client.post("/api/v1/instances/rtx4090-0-aa/logs", json={"protocol": 1, "lines": ["x"]},
                               headers=auth("rtx4090-0-aa"))
    assert logs.status_code == 410


def test_directive_needs_the_instances_own_token(harness: Harness) -> None:
    harness.register("rtx4090-0-aa")
    url = "/api/v1/instances/rtx4090-0-aa/directive"
    assert harness.client.get(url).status_code == 401
    assert harness.client.get(url, headers=auth("rtx4090-1-bb")).status_code == 403
    assert harness.client.post(url, json={}, headers=auth("rtx4090-0-aa")).status_code == 405


def test_a_v1_store_is_upgraded_in_place_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite_store_at(path, 1)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO instances (instance_id, received_at, worker_at) VALUES "
                 "('p-0-a', '2026-12-02T17:59:01+00:00', '2026-12-02T17:59:00+00:00')")
    conn.commit()
    conn.close()
    store = SqliteStore(path)
    try:
        assert [r.instance_id for r in store.reports()] == ["p-0-a"]
        store.set_directives({"p-0-a": {"protocol": 1, "action": "serve", "reason": "ok"}}, T0)
        assert store.directive("p-0-a") == {"protocol": 1, "action": "serve", "reason": "ok",
                                            "at": "2026-12-02T18:00:00Z"}
    finally:
        store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5  # v5: sessions
    conn.close()
