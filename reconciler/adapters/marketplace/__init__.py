"""Marketplace adapters behind one port (`reconciler.domain.marketplace.Marketplace`), and their registry.

`BACKENDS` is the one place to add a backend: its name, how to build it from plain settings (what a
pickled Pulumi provider and `fleet apply` can carry) plus secrets, how the CLI's options become those
settings, and whether it runs a worker-image directory (local) or a registry image pinned by digest. Owned Docker
hosts (`hosts`) are a backend of their own, or sit beside a rental market (`hosts_file` in any backend's settings:
`combined.py` routes each pool's search to one of them).
Adapters are imported when built, so importing this package pulls in no HTTP library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.adapters.settings import settings
from reconciler.domain.marketplace import (
    INSTANCE_STATUSES,
    Instance,
    InstanceRequest,
    Marketplace,
    MarketplaceAuthError,
    MarketplaceError,
    Offer,
    OfferQuery,
    OfferTakenError,
    PermanentMarketplaceError,
    TemporaryMarketplaceError,
)

if TYPE_CHECKING:
    from reconciler.adapters.marketplace.hosts import HostsMarketplace


@dataclass(frozen=True)
class Backend:
    name: str
    description: str
    #: plain settings + secrets ({"vast_api_key": ...}) -> a live adapter
    build: Callable[[Mapping[str, Any], Mapping[str, str]], Marketplace]
    #: the CLI's options (`fleet apply`/`plan`) + the state directory -> plain settings; raises ValueError
    settings_from_options: Callable[[Mapping[str, Any], Path], dict[str, Any]]
    #: True: instances run a worker-image directory on this host; False: a registry image pinned by digest
    runs_image_directory: bool


def _build_local(backend: Mapping[str, Any], _secrets: Mapping[str, str]) -> Marketplace:
    from reconciler.adapters.marketplace.local import LocalMarketplace, load_local_machines

    machines = load_local_machines(backend["machines_file"])
    return LocalMarketplace(backend["state_dir"], machines, worker_command=backend.get("worker_command") or None)


def _local_settings(options: Mapping[str, Any], state_dir: Path) -> dict[str, Any]:
    if not options.get("machines"):
        raise ValueError("the local backend needs --machines FILE (the declared local machines)")
    out: dict[str, Any] = {"kind": "local", "state_dir": str(state_dir / "market"),
                           "machines_file": str(options["machines"])}
    if options.get("worker_command"):
        import shlex

        out["worker_command"] = shlex.split(str(options["worker_command"]))
    return out


def _build_vastai(backend: Mapping[str, Any], secrets: Mapping[str, str]) -> Marketplace:
    from reconciler.adapters.marketplace.vastai import DEFAULT_BASE_URL, VastAiMarketplace

    from_env = settings().vast_api_key
    key: str | None
    if secrets.get("vast_api_key"):
        key, source = secrets["vast_api_key"], "the stack config secret fleet:vastaiApiKey"
    else:
        key = from_env.reveal() if from_env else None
        source = from_env.source if from_env else "$VAST_API_KEY (not set)"
    # `time_scale` (tests only): shrink pacing and waits alike for a fake whose limits are scaled the same.
    return VastAiMarketplace(key, key_source=source, base_url=backend.get("base_url") or DEFAULT_BASE_URL,
                             time_scale=float(backend.get("time_scale") or 1.0))


def _vastai_settings(options: Mapping[str, Any], _state_dir: Path) -> dict[str, Any]:
    return {"kind": "vastai", "base_url": options.get("vast_base_url")}


def _load_owned(hosts_file: str) -> HostsMarketplace:
    from reconciler.adapters.marketplace.docker_engine import SdkDockerEngine  # the docker SDK: only when used
    from reconciler.adapters.marketplace.hosts import HostsMarketplace
    from reconciler.adapters.spec_files import load_hosts
    from reconciler.domain.spec import SpecError

    try:
        hosts = load_hosts(Path(hosts_file))
    except SpecError as exc:
        raise PermanentMarketplaceError(str(exc)) from None
    if hosts is None:
        raise PermanentMarketplaceError(f"{hosts_file}: file not found (the owned-hosts inventory)")
    return HostsMarketplace(hosts, SdkDockerEngine)


def _build_hosts(backend: Mapping[str, Any], _secrets: Mapping[str, str]) -> Marketplace:
    if not backend.get("hosts_file"):
        raise PermanentMarketplaceError("the hosts backend needs hosts_file (the owned-hosts inventory)")
    return _load_owned(str(backend["hosts_file"]))


def _hosts_settings(options: Mapping[str, Any], _state_dir: Path) -> dict[str, Any]:
    if not options.get("hosts"):
        raise ValueError("the hosts backend needs --hosts FILE (fleet-spec/hosts.yaml)")
    return {"kind": "hosts"}


BACKENDS: dict[str, Backend] = {
    "hosts": Backend("hosts", "owned Docker hosts (--hosts, default fleet-spec/hosts.yaml), one worker per GPU",
                     _build_hosts, _hosts_settings, runs_image_directory=False),
    "local": Backend("local", "declared machines on this host, each instance a worker process (demo, tests)",
                     _build_local, _local_settings, runs_image_directory=True),
    "vastai": Backend("vastai", "vast.ai REST API (API key from the stack config or $VAST_API_KEY)",
                      _build_vastai, _vastai_settings, runs_image_directory=False),
}


def backend_named(name: object) -> Backend:
    if not isinstance(name, str) or name not in BACKENDS:
        raise PermanentMarketplaceError(f"unknown marketplace backend {name!r} (expected one of "
                                        f"{', '.join(sorted(BACKENDS))})")
    return BACKENDS[name]


def build_marketplace(backend: Mapping[str, Any], secret_values: Mapping[str, str]) -> Marketplace:
    """A marketplace adapter from plain settings (`{"kind": NAME, ...}`) and secrets. With `hosts_file` beside a
    rental backend, pools on owned hosts are served by the hosts adapter and the others by the rental market."""
    market = backend_named(backend.get("kind")).build(backend, secret_values)
    if backend.get("hosts_file") and backend.get("kind") != "hosts":
        from reconciler.adapters.marketplace.combined import CombinedMarketplace

        return CombinedMarketplace(market, _load_owned(str(backend["hosts_file"])))
    return market


def settings_with_hosts(settings: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """`--hosts FILE` (any backend): the owned-hosts inventory beside the market."""
    if options.get("hosts"):
        settings["hosts_file"] = str(Path(options["hosts"]).resolve())
    return settings


__all__ = [
    "BACKENDS",
    "INSTANCE_STATUSES",
    "Backend",
    "Instance",
    "InstanceRequest",
    "Marketplace",
    "MarketplaceAuthError",
    "MarketplaceError",
    "Offer",
    "OfferQuery",
    "OfferTakenError",
    "PermanentMarketplaceError",
    "TemporaryMarketplaceError",
    "backend_named",
    "build_marketplace",
    "settings_with_hosts",
]
