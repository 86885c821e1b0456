"""The provisioning side tells the controller about destroyed instances: real HTTP on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from reconciler.adapters.controller.client import ControllerAdminClient, ControllerClientError, admin_client_from
from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.tokens import instance_token

SECRET = b"s" * 32
ADMIN = "admin-token-for-tests"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ControllerServer, SqliteStore]]:
    store = SqliteStore(tmp_path / "c.db")
    srv = ControllerServer(store, SECRET, ADMIN).start()
    yield srv, store
    srv.stop()
    store.close()


def _register(base_url: str, instance_id: str) -> None:
    body = {"protocol": 1, "instance_id": instance_id, "at": "2026-12-02T10:00:00Z", "machine_id": "41001"}
    r = httpx.post(f"{base_url}/api/v1/instances/{instance_id}/register", json=body,
                   headers={"Authorization": f"Bearer {instance_token(SECRET, instance_id)}"})
    assert r.status_code == 200, r.text


def test_destroyed_instance_is_marked(server: tuple[ControllerServer, SqliteStore]) -> None:
    srv, store = server
    _register(srv.url, "rtx4090-0-abc123")
    client = ControllerAdminClient(srv.url, ADMIN)
    client.mark_destroyed("rtx4090-0-abc123")
    report = store.report("rtx4090-0-abc123")
    assert report is not None and report.destroyed_at is not None
    assert report.destroyed_at <= datetime.now(UTC)
    client.mark_destroyed("rtx4090-0-abc123")  # idempotent
    client.mark_destroyed("never-registered-1")  # a worker that died before registering: nothing to mark
    client.close()


def test_wrong_admin_token_is_an_error_without_the_token(server: tuple[ControllerServer, SqliteStore]) -> None:
    srv, store = server
    _register(srv.url, "rtx4090-1-abc123")
    client = ControllerAdminClient(srv.url, "wrong-admin-token-xyz")
    with pytest.raises(ControllerClientError) as err:
        client.mark_destroyed("rtx4090-1-abc123")
    assert "403" in str(err.value) and "wrong-admin-token-xyz" not in str(err.value)
    assert "wrong-admin-token-xyz" not in repr(client)
    report = store.report("rtx4090-1-abc123")
    assert report is not None and report.destroyed_at is None


def test_no_client_without_url_or_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_ADMIN_TOKEN", raising=False)
    assert admin_client_from("http://127.0.0.1:1") is None
    assert admin_client_from(None, "t") is None
    monkeypatch.setenv("FLEET_ADMIN_TOKEN", "from-env")
    client = admin_client_from("http://127.0.0.1:1")
    assert client is not None
    client.close()
