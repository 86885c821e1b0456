"""Admin client of the controller API, used by the provisioning side (slot provider, `fleet apply`).

When a slot's instance is destroyed, the provisioner tells the controller, so the instance's timeline
ends with "destroyed" and its token stops being accepted; its logs stay readable. The one adapter for
talking to the controller over HTTP from our side (workers speak the protocol from shell).
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

from reconciler.adapters.settings import settings


class ControllerClientError(Exception):
    """The controller did not accept a notification. Never carries the admin token."""


class ControllerAdminClient:
    def __init__(self, base_url: str, admin_token: str, *, timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None):
        self._base_url = base_url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_s, transport=transport,
                                    headers={"Authorization": f"Bearer {admin_token}"})

    def __repr__(self) -> str:
        return f"ControllerAdminClient({self._base_url!r})"

    def mark_destroyed(self, instance_id: str) -> None:
        url = f"{self._base_url}/api/v1/instances/{quote(instance_id, safe='')}/destroyed"
        try:
            response = self._client.post(url, json={})
        except httpx.HTTPError as exc:
            raise ControllerClientError(f"POST {url}: {type(exc).__name__}: {exc}") from None
        # 404: the worker never registered (it died before), nothing to mark; 410: already destroyed.
        if response.status_code not in (200, 404, 410):
            raise ControllerClientError(f"POST {url}: HTTP {response.status_code}: {response.text[:200]}")

    def close(self) -> None:
        self._client.close()


def admin_client_from(controller_url: str | None, admin_token: str | None = None) -> ControllerAdminClient | None:
    """A client when both the URL and an admin token (argument or $FLEET_ADMIN_TOKEN) are known, else None:
    notifying the controller is optional, destroying is not."""
    from_env = settings().admin_token
    token = admin_token or (from_env.reveal() if from_env else None)
    if not controller_url or not token:
        return None
    return ControllerAdminClient(controller_url, token)
