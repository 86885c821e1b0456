"""Pulumi dynamic provider over the slot provider: the package's only `import pulumi`.

infra/hosts.py declares one resource per slot with this provider. Pulumi pickles the provider by module
path, so `reconciler.provider` re-exports it for stacks created before the layout move.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

from reconciler.adapters.controller.client import admin_client_from
from reconciler.adapters.marketplace import build_marketplace
from reconciler.adapters.slot_provider import SlotProvider, controller_secret_from, image_login_from
from reconciler.domain.slots import PULUMI_UNKNOWN, SlotInputError, SlotInputs, SlotOutputs, slot_diff

# --- Pulumi dynamic provider --------------------------------------------------------------------------------


class SlotResourceProvider(ResourceProvider):
    """Pulumi dynamic provider over `SlotProvider`. Carries only plain backend settings when pickled; the
    vast.ai API key and the controller secret are read in `configure` from the stack config secrets
    (`gpu-fleet:vastaiApiKey`, `gpu-fleet:controllerSecret`), or from the environment."""

    def __init__(self, backend: Mapping[str, Any]):
        super().__init__()
        self.backend = dict(backend)
        self._secrets: dict[str, str] = {}
        self._slot_provider: SlotProvider | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Never pickle secrets or live clients into the Pulumi state.
        return {"backend": self.backend, "_secrets": {}, "_slot_provider": None}

    def configure(self, req: Any) -> None:
        for key, name in (("vastaiApiKey", "vast_api_key"), ("controllerSecret", "controller_secret"),
                          ("controllerAdminToken", "controller_admin_token"),
                          ("registryServer", "registry_server"), ("registryUsername", "registry_username"),
                          ("registryPassword", "registry_password")):
            value = req.config.get(key)
            if value:
                self._secrets[name] = str(value)

    def slot_provider(self) -> SlotProvider:
        if self._slot_provider is None:
            notifier = admin_client_from(self.backend.get("controller_url"),
                                         self._secrets.get("controller_admin_token"))
            self._slot_provider = SlotProvider(
                build_marketplace(self.backend, self._secrets), controller_secret_from(self._secrets),
                image_login=image_login_from(self._secrets),
                on_destroyed=(lambda out: notifier.mark_destroyed(out.instance_id)) if notifier else None)
        return self._slot_provider

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        if any(v == PULUMI_UNKNOWN for v in news.values()):
            return CheckResult(news, [])
        try:
            SlotInputs.from_props(news)
        except SlotInputError as exc:
            return CheckResult(news, [CheckFailure("pool", str(exc))])
        return CheckResult(news, [])

    def create(self, props: dict[str, Any]) -> CreateResult:
        outputs = self.slot_provider().create(SlotInputs.from_props(props))
        return CreateResult(outputs.instance_id, {**_inputs_only(props), **outputs.to_props()})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # In a preview, inputs computed from other resources are PULUMI_UNKNOWN. The digest is judged by
        # slot_diff (may replace); any other unknown is read as its old value so the inputs still parse.
        news = {k: (olds.get(k) if v == PULUMI_UNKNOWN and k != "image_digest" else v) for k, v in news.items()}
        old = SlotOutputs.from_props(olds)
        result = slot_diff(old, SlotInputs.from_props(news))
        if result.replace:
            return DiffResult(changes=True, replaces=list(result.replaces), delete_before_replace=True)
        changed = _inputs_only(olds) != _inputs_only(news)
        return DiffResult(changes=changed, replaces=[], delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only inputs that steer the *next* create changed (ranking data, constraints): the instance stays.
        old = SlotOutputs.from_props(olds)
        return UpdateResult({**_inputs_only(news), **old.to_props()})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        fresh = self.slot_provider().read(SlotOutputs.from_props(props))
        if fresh is None:
            return ReadResult(None, {})
        return ReadResult(id_, {**_inputs_only(props), **fresh.to_props()})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        self.slot_provider().delete(SlotOutputs.from_props(props))


_INPUT_KEYS = frozenset(SlotInputs.__dataclass_fields__)


def _inputs_only(props: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k in _INPUT_KEYS}
