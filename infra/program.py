"""The Pulumi program: stack config + fleet spec + records -> WorkerImage + one GpuPool per pool -> exports.

Every config key is documented in Pulumi.yaml (`config:` block). Secrets (registry password, vast.ai API
key, controller secret) are stack config secrets; the program reads only the registry password (it
builds and pushes), the slot provider reads the other two itself in `configure`, so they never become
resource inputs or state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from infra.hosts import GpuPool, GpuPoolArgs
from infra.image import WorkerImage, WorkerImageArgs
from reconciler.adapters.pulumi_provider import PROJECT, default_pool_data_dir
from reconciler.adapters.record_index import load_indexed
from reconciler.adapters.slot_provider import directory_digest
from reconciler.adapters.spec_files import load_spec

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class StackConfig:
    spec_path: Path
    backend: str
    vast_base_url: str | None
    local_state_dir: Path | None
    local_machines_file: Path | None
    registry_server: str | None
    registry_username: str | None
    registry_password: pulumi.Output[str] | None
    pool_data_dir: Path = REPO_ROOT / ".fleet" / "pulumi" / "pool-data"
    #: Owned Docker hosts (fleet-spec/hosts.yaml): a backend of their own, or beside the market.
    hosts_file: Path | None = None


def _path(value: str | None, default: str | None = None) -> Path | None:
    text = value or default
    if text is None:
        return None
    path = Path(text)
    return path if path.is_absolute() else REPO_ROOT / path


def load_stack_config(cfg: pulumi.Config | None = None) -> StackConfig:
    cfg = cfg or pulumi.Config()
    backend = cfg.get("backend") or "vastai"
    if backend not in ("vastai", "local", "hosts"):
        raise ValueError(f"stack config {PROJECT}:backend: got {backend!r}, expected vastai, local or hosts")
    spec_path = _path(cfg.get("specPath"), "fleet-spec/fleet.yaml")
    assert spec_path is not None
    hosts_file = _path(cfg.get("hostsFile")) or (spec_path.parent / "hosts.yaml")
    return StackConfig(
        spec_path=spec_path,
        backend=backend,
        vast_base_url=cfg.get("vastBaseUrl") or None,
        local_state_dir=_path(cfg.get("localStateDir"), ".fleet/pulumi-local") if backend == "local" else None,
        local_machines_file=_path(cfg.get("localMachinesFile")) if backend == "local" else None,
        registry_server=cfg.get("registryServer") or None,
        registry_username=cfg.get("registryUsername") or None,
        registry_password=cfg.get_secret("registryPassword"),
        pool_data_dir=_path(cfg.get("poolDataDir")) or Path(default_pool_data_dir(REPO_ROOT)),
        hosts_file=hosts_file if hosts_file.is_file() or backend == "hosts" else None,
    )


def backend_settings(conf: StackConfig, controller_url: str | None = None) -> dict[str, Any]:
    """Plain settings the pickled slot provider carries (no secrets). `controller_url`: where the provider
    reports destroyed instances (only when the stack has a controllerAdminToken)."""
    settings: dict[str, Any]
    if conf.backend == "local":
        if conf.local_machines_file is None:
            raise ValueError(f"stack config {PROJECT}:localMachinesFile is required when {PROJECT}:backend is local")
        settings = {"kind": "local", "state_dir": str(conf.local_state_dir),
                    "machines_file": str(conf.local_machines_file)}
    elif conf.backend == "hosts":
        settings = {"kind": "hosts"}
    else:
        settings = {"kind": "vastai"}
        if conf.vast_base_url:
            settings["base_url"] = conf.vast_base_url
    if conf.hosts_file is not None:
        settings["hosts_file"] = str(conf.hosts_file)
    if controller_url:
        settings["controller_url"] = controller_url
    settings["pool_data_dir"] = str(conf.pool_data_dir)
    return settings


def main(conf: StackConfig | None = None) -> dict[str, Any]:
    conf = conf or load_stack_config()
    spec = load_spec(conf.spec_path)
    records = load_indexed(conf.spec_path.parent)
    for problem in records.problems:
        pulumi.log.warn(f"record unreadable, its machine is treated as bad: {problem}")

    context = _path(spec.image.context)
    assert context is not None
    image: WorkerImage | None = None
    if conf.backend == "local":
        # The local marketplace runs the worker-image directory itself (bash entrypoint.sh), pinned by a
        # digest over its files - what `fleet apply --backend local` does; no registry, no docker build.
        image_ref: pulumi.Input[str] = str(context)
        image_digest: pulumi.Input[str] | None = directory_digest(context)
    else:
        image = WorkerImage("worker", WorkerImageArgs(
            repository=spec.image.repository, context=str(context), platform=spec.image.platform,
            base_image=spec.image.base_image, registry_server=conf.registry_server,
            registry_username=conf.registry_username, registry_password=conf.registry_password))
        image_ref, image_digest = image.repo_digest, None

    backend = backend_settings(conf, spec.controller.url)
    params_dir = str(conf.local_state_dir / "params") if conf.local_state_dir else None
    pools = {pool.name: GpuPool(pool.name, GpuPoolArgs(spec=spec, pool=pool, records=records,
                                                       image_ref=image_ref, image_digest=image_digest,
                                                       backend=backend, params_dir=params_dir))
             for pool in spec.pools}

    exports: dict[str, Any] = {
        "image_repo_digest": image_ref,
        "bad_machine_ids": sorted(records.bad_machine_ids()),
        "slots": {slot: {"instance_id": res.instance_id, "machine_id": res.machine_id,
                         "contract_id": res.contract_id, "status": res.status}
                  for gpu_pool in pools.values() for slot, res in gpu_pool.slots.items()},
    }
    for key, value in exports.items():
        pulumi.export(key, value)
    return {"image": image, "pools": pools, **exports}
