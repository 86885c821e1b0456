"""Pulumi dynamic provider over the slot provider: the package's only `import pulumi`.

infra/hosts.py declares one resource per slot with this provider. The engine runs it in the SDK's provider
host (`python -m pulumi.dynamic`, started by the launcher `pulumi-resource-pulumi-python` in the program's
`main:` directory), which unpickles it by module path - so `reconciler.provider` re-exports it for stacks
created before the layout move. Facts about the host, cited at pulumi/pulumi@1b5949891b file:line, are in
tests/pulumi_engine/host.py (which drives the real host over gRPC).

What crosses the boundary, and how it is handled here:
- every prop is a protobuf Struct value: numbers are doubles and None-valued keys vanish. Every read goes
  through the one typed decode (`decode_slot_inputs` / `decode_slot_outputs`, domain/slots.py);
- during preview (Check, Diff) values not known yet are `pulumi.output.Unknown` objects: mapped to the
  domain's UNKNOWN, never compared with text and never read as truthy;
- the records-derived part of a slot's inputs (excluded machines, measured rates) is one content-addressed
  file per pool (`PoolData`, written by the program in `pool_data_dir`); each slot carries its digest;
- configuration: the engine hands a dynamic provider the WHOLE stack config with namespaced keys
  (`gpu-fleet:controllerSecret`), secrets unwrapped (pulumi >= 3.139);
- `customTimeouts` never reach a dynamic provider (the host ignores the request's timeout): the slot
  provider's own deadlines (per-request HTTP timeouts, bounded offer attempts) are the only ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
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
from pulumi.output import Unknown

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.controller.client import admin_client_from
from reconciler.adapters.marketplace import build_marketplace
from reconciler.adapters.slot_provider import SlotProvider, controller_secret_from, image_login_from
from reconciler.domain.slots import (
    UNKNOWN,
    PoolData,
    SlotInputError,
    SlotInputs,
    decode_slot_inputs,
    decode_slot_outputs,
    slot_diff,
)

#: The Pulumi project (Pulumi.yaml `name:`); stack config keys are `gpu-fleet:<key>`.
PROJECT = "gpu-fleet"

#: Stack config keys the provider reads (project-relative) -> the slot provider's secret names.
CONFIG_KEYS = (("vastaiApiKey", "vast_api_key"), ("controllerSecret", "controller_secret"),
               ("controllerAdminToken", "controller_admin_token"), ("registryServer", "registry_server"),
               ("registryUsername", "registry_username"), ("registryPassword", "registry_password"))

#: Inputs that only steer the NEXT create (ranking data, holds): a change alone leaves the instance as it is
#: and previews as no change.
_STEERING_ONLY = frozenset({"pool_data", "bad_machine_ids", "measured", "priors", "paused_reason",
                            "retest_machine_ids"})


def from_pulumi(value: Any) -> Any:
    """Map the SDK's preview Unknowns (anywhere in the value) to the domain's UNKNOWN."""
    if isinstance(value, Unknown):
        return UNKNOWN
    if isinstance(value, dict):
        return {k: from_pulumi(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_pulumi(v) for v in value]
    return value


# --- pool data: one content-addressed file per pool -------------------------------------------------------


def write_pool_data(directory: str | Path, data: PoolData) -> dict[str, Any]:
    """Store a pool's records-derived inputs once; return the small reference each slot carries."""
    ref = data.ref()
    path = Path(directory) / (ref["digest"].removeprefix("sha256:") + ".json")
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, data.to_json())
    return ref


def read_pool_data(directory: str | Path, digest: str) -> PoolData:
    path = Path(directory) / (digest.removeprefix("sha256:") + ".json")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SlotInputError(f"pool data {digest} not found in {directory}: the Pulumi program writes it when it "
                             "runs; run `pulumi preview`/`pulumi up` from this checkout", field="pool_data") from None
    return PoolData.from_json(text, str(path))


# --- the provider -------------------------------------------------------------------------------------------


class SlotResourceProvider(ResourceProvider):
    """Pulumi dynamic provider over `SlotProvider`. Carries only plain backend settings when pickled; the
    vast.ai API key and the controller secret are read in `configure` from the stack config
    (`gpu-fleet:vastaiApiKey`, `gpu-fleet:controllerSecret`, secrets), or from the environment."""

    def __init__(self, backend: Mapping[str, Any]):
        super().__init__()
        self.backend = dict(backend)
        self._secrets: dict[str, str] = {}
        self._slot_provider: SlotProvider | None = None
        self._pool_data: dict[str, PoolData] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Never pickle secrets, caches or live clients into the Pulumi state.
        return {"backend": self.backend, "_secrets": {}, "_slot_provider": None, "_pool_data": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Stacks pickled before pool data existed have no `_pool_data`.
        self.__dict__.update({"_secrets": {}, "_slot_provider": None, "_pool_data": {}, **state})

    def configure(self, req: Any) -> None:
        for key, name in CONFIG_KEYS:
            value = req.config.get(key)  # project-relative: reads `gpu-fleet:<key>`
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

    def resolve_pool_data(self, digest: str) -> PoolData:
        if digest not in self._pool_data:
            directory = self.backend.get("pool_data_dir")
            if not directory:
                raise SlotInputError("slot inputs name pool data, but the provider has no pool_data_dir",
                                     field="pool_data")
            self._pool_data[digest] = read_pool_data(directory, digest)
        return self._pool_data[digest]

    def decode_inputs(self, props: Mapping[str, Any], *, preview: bool = False) -> SlotInputs:
        return decode_slot_inputs(from_pulumi({k: v for k, v in props.items() if k != "__provider"}),
                                  resolve_pool_data=self.resolve_pool_data, allow_unknown=preview)

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        try:
            self.decode_inputs(news, preview=True)
        except SlotInputError as exc:
            prop = (exc.field or "slot").split(".")[0].split("[")[0]
            return CheckResult(news, [CheckFailure(prop, str(exc))])
        return CheckResult(news, [])

    def create(self, props: dict[str, Any]) -> CreateResult:
        outputs = self.slot_provider().create(self.decode_inputs(props))
        return CreateResult(outputs.instance_id, {**_inputs_only(props), **outputs.to_props()})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        old = decode_slot_outputs(olds)
        new = self.decode_inputs(news, preview=True)
        # `now`: the status table's deadlines (loading/scheduling/unknown/... too long) count from status_since.
        result = slot_diff(old, new, now=time.time())
        if result.replace:
            replaces = ["pool_data" if p == "bad_machine_ids" and "pool_data" in news else p for p in result.replaces]
            return DiffResult(changes=True, replaces=replaces, delete_before_replace=True)
        old_inputs = {k: v for k, v in _inputs_only(olds).items() if k not in _STEERING_ONLY}
        new_inputs = {k: v for k, v in _inputs_only(from_pulumi(news)).items() if k not in _STEERING_ONLY}
        return DiffResult(changes=old_inputs != new_inputs, replaces=[], delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only inputs that steer the *next* create changed (constraints, ranking data): the instance stays.
        self.decode_inputs(news)  # refuse bad inputs here too, naming slot and field
        old = decode_slot_outputs(olds)
        return UpdateResult({**_inputs_only(news), **old.to_props()})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        fresh = self.slot_provider().read(decode_slot_outputs(props))
        if fresh is None:
            return ReadResult(None, {})
        return ReadResult(id_, {**_inputs_only(props), **fresh.to_props()})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        self.slot_provider().delete(decode_slot_outputs(props))


_INPUT_KEYS = frozenset(SlotInputs.__dataclass_fields__) | {"pool_data"}


def _inputs_only(props: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k in _INPUT_KEYS}


def default_pool_data_dir(repo_root: str | Path) -> str:
    """Where the program writes pool data: inside the checkout, beside local state (git-ignored)."""
    return os.fspath(Path(repo_root) / ".fleet" / "pulumi" / "pool-data")
