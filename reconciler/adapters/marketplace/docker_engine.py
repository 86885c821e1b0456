"""The Docker engine of one owned host, over the Docker SDK for Python: the only module that imports `docker`.

Place in the flow: the `hosts` marketplace adapter (`hosts.py`) talks to each inventory host through the small
`DockerEngine` port it defines; this is that port's real adapter. Tests use the same adapter against a real
dockerd reached through a real sshd (tests/integration/test_owned_hosts.py) and a fake of the port elsewhere.

Why the SDK, and why over paramiko: the SDK speaks the Engine API (typed errors, labels and filters, device
requests) where parsing the `docker` CLI's output would not, and it carries Docker's own `ssh://user@host[:port]`
transport (it runs `docker system dial-stdio` on the host, as the CLI does). It has two ways to open that SSH
connection: paramiko (`use_ssh_client=False`, the default, the `docker[ssh]` extra) or the `ssh` binary. With the
binary, a refused key, a changed host key or an unreachable host all look the same from here (the `ssh` process
writes to our stderr and the SDK sees a closed socket); with paramiko each is its own exception
(AuthenticationException, BadHostKeyException, SSHException for an unknown host key, a socket error), so each
fault gets its one clear line. The SDK's paramiko client reads the user's ~/.ssh/config (HostName, Port, User,
IdentityFile, ProxyCommand) and ~/.ssh/known_hosts, and refuses unknown host keys (RejectPolicy): trust is set
up once with `ssh-keyscan`/`ssh` by the operator, never accepted blindly here (docker/docker-py
docker/transport/sshconn.py, 7.1.0).

Every failure is a marketplace error naming the host and the cause (`HostError`, causes below); no credential is
ever part of a message (the SSH key and registry password never are; paramiko names key types, not keys).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import docker
import docker.errors
import docker.tls
import docker.types
import paramiko

from reconciler.adapters.marketplace.hosts import (
    CAUSE_AUTH_REFUSED,
    CAUSE_DOCKER_DOWN,
    CAUSE_HOST_KEY_CHANGED,
    CAUSE_HOST_KEY_UNKNOWN,
    CAUSE_NO_GPU_TOOLS,
    CAUSE_PULL_REFUSED,
    CAUSE_REFUSED,
    CAUSE_UNKNOWN_GPU,
    CAUSE_UNREACHABLE,
    ContainerRequest,
    ContainerView,
    EngineInfo,
    HostError,
)
from reconciler.domain.hosts import OwnedHost

log = logging.getLogger(__name__)

#: Seconds for a TCP connect to the host and for each Engine API call (a hung host must not hang a pass).
CONNECT_TIMEOUT_S = 10.0
API_TIMEOUT_S = 60.0
#: How long a worker gets to stop (SIGTERM: it finishes its report) before it is killed.
STOP_GRACE_S = 20


def _host_and_port(endpoint: str) -> tuple[str, int]:
    parts = urlsplit(endpoint)
    default = 22 if parts.scheme == "ssh" else 2376
    return parts.hostname or "", parts.port or default


class SdkDockerEngine:
    """`DockerEngine` for one inventory host over the Docker SDK. Connects lazily, once."""

    def __init__(self, host: OwnedHost, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 api_timeout_s: float = API_TIMEOUT_S, stop_grace_s: int = STOP_GRACE_S):
        self.host = host
        self._stop_grace_s = stop_grace_s
        self._connect_timeout_s = connect_timeout_s
        self._api_timeout_s = api_timeout_s
        self._client: docker.DockerClient | None = None

    def __repr__(self) -> str:
        return f"SdkDockerEngine({self.host.name}, {self.host.docker})"

    # --- connecting ---------------------------------------------------------------------------------------------

    def _fault(self, cause: str, detail: str, *, temporary: bool) -> HostError:
        return HostError(self.host.name, cause, detail, temporary=temporary)

    def _connect(self) -> docker.DockerClient:
        if self._client is not None:
            return self._client
        address, port = _host_and_port(self.host.docker)
        # A blackholed host would hang paramiko's connect (the SDK passes it no timeout): look first, bounded.
        try:
            with socket.create_connection((address, port), timeout=self._connect_timeout_s):
                pass
        except OSError as exc:
            raise self._fault(CAUSE_UNREACHABLE, f"cannot connect to {address}:{port} ({exc.strerror or exc})",
                              temporary=True) from None
        try:
            if self.host.docker.startswith("ssh://"):
                client = docker.DockerClient(base_url=self.host.docker, use_ssh_client=False,
                                             timeout=int(self._api_timeout_s))
            else:
                tls = self.host.tls
                assert tls is not None  # the inventory refuses tcp:// without tls
                config = docker.tls.TLSConfig(client_cert=(tls.cert, tls.key), ca_cert=tls.ca, verify=True)
                client = docker.DockerClient(base_url=self.host.docker.replace("tcp://", "https://", 1), tls=config,
                                             timeout=int(self._api_timeout_s))
        except paramiko.BadHostKeyException as exc:
            raise self._fault(CAUSE_HOST_KEY_CHANGED,
                              f"{address}:{port} presented a {exc.key.get_name()} key that differs from the one in "
                              "known_hosts; not connecting (check the host, then update known_hosts)",
                              temporary=False) from None
        except paramiko.AuthenticationException:
            user = urlsplit(self.host.docker).username or "(default user)"
            raise self._fault(CAUSE_AUTH_REFUSED, f"{address}:{port} refused SSH authentication for user {user} "
                              "(no key it accepts: check IdentityFile in ~/.ssh/config and authorized_keys)",
                              temporary=False) from None
        except paramiko.SSHException as exc:
            text = str(exc)
            if "known_hosts" in text or "not found in" in text:
                raise self._fault(CAUSE_HOST_KEY_UNKNOWN, f"{address}:{port} is not in known_hosts; not trusting an "
                                  "unknown host key (add it with ssh-keyscan after checking its fingerprint)",
                                  temporary=False) from None
            raise self._fault(CAUSE_UNREACHABLE, f"SSH to {address}:{port} failed: {_short(text)}",
                              temporary=True) from None
        except docker.errors.DockerException as exc:
            raise self._fault(CAUSE_DOCKER_DOWN, f"Docker did not answer at {self.host.docker}: {_short(str(exc))}",
                              temporary=True) from None
        except OSError as exc:
            raise self._fault(CAUSE_UNREACHABLE, f"cannot reach {self.host.docker}: {exc.strerror or exc}",
                              temporary=True) from None
        self._client = client
        return client

    @contextlib.contextmanager
    def _api(self, what: str) -> Iterator[docker.DockerClient]:
        """One Engine API call: connection faults and API errors become HostErrors naming the host."""
        client = self._connect()
        try:
            yield client
        except HostError:
            raise
        except docker.errors.APIError as exc:
            raise self._fault(CAUSE_REFUSED, f"Docker refused to {what}: {_short(exc.explanation or str(exc))}",
                              temporary=False) from None
        except (docker.errors.DockerException, paramiko.SSHException, OSError, EOFError) as exc:
            self.close()  # the connection may be dead: the next call connects again
            raise self._fault(CAUSE_DOCKER_DOWN, f"Docker stopped answering while asked to {what}: "
                              f"{_short(str(exc)) or type(exc).__name__}", temporary=True) from None

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    # --- the port -----------------------------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        with self._api("report its info") as client:
            raw = client.info()
        return EngineInfo(runtimes=frozenset((raw.get("Runtimes") or {}).keys()),
                          server_version=str(raw.get("ServerVersion") or "?"),
                          default_runtime=str(raw.get("DefaultRuntime") or "runc"))

    def containers(self, label_key: str) -> list[ContainerView]:
        with self._api("list containers") as client:
            found = client.api.containers(all=True, filters={"label": label_key})
            ids = [str(c["Id"]) for c in found]
            views = [self._inspect(client, cid) for cid in ids]
        return [v for v in views if v is not None]

    def container(self, container_id: str) -> ContainerView | None:
        with self._api(f"inspect container {container_id[:12]}") as client:
            return self._inspect(client, container_id)

    def pull(self, image: str, auth: Mapping[str, str] | None) -> None:
        repository, _, digest = image.partition("@")
        with self._api(f"pull {image}") as client:
            try:
                for line in client.api.pull(repository, tag=digest or None, stream=True, decode=True,
                                            auth_config=dict(auth) if auth else None):
                    error = line.get("error") if isinstance(line, dict) else None
                    if error:
                        raise self._fault(CAUSE_PULL_REFUSED, f"cannot pull {image}: {_short(str(error))}",
                                          temporary=False)
            except docker.errors.APIError as exc:
                raise self._fault(CAUSE_PULL_REFUSED, f"cannot pull {image}: "
                                  f"{_short(exc.explanation or str(exc))}", temporary=False) from None

    def run(self, request: ContainerRequest) -> str:
        with self._api(f"start container {request.name}") as client:
            kwargs: dict[str, Any] = {"image": request.image, "name": request.name, "detach": True,
                                      "environment": dict(request.env), "labels": dict(request.labels),
                                      "network_mode": request.network_mode, "restart_policy": {"Name": "no"}}
            if request.runtime:
                kwargs["runtime"] = request.runtime
            if request.gpu_device:
                kwargs["device_requests"] = [docker.types.DeviceRequest(
                    driver="nvidia", device_ids=[request.gpu_device],
                    capabilities=[["gpu"]])]
            if request.mem_limit_bytes:
                kwargs["mem_limit"] = request.mem_limit_bytes
            container = client.containers.create(**kwargs)
            try:
                container.start()
            except docker.errors.APIError as exc:
                # A container the runtime would not start must not stay behind (it would look like a worker).
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
                text = str(exc.explanation or exc)
                # The NVIDIA runtime's own line says what it refused; the OCI wrapping before it says nothing.
                said = text[text.index("nvidia-container-cli:"):] if "nvidia-container-cli:" in text else text
                if "unknown device" in said:
                    gpu = request.gpu_device or request.env.get("NVIDIA_VISIBLE_DEVICES", "?")
                    raise self._fault(CAUSE_UNKNOWN_GPU, f"GPU {gpu} is not on this host (the NVIDIA runtime: "
                                      f"{_short(said)})", temporary=False) from None
                raise self._fault(CAUSE_REFUSED, f"the container for {request.name} did not start: {_short(said)}",
                                  temporary=False) from None
            return str(container.id)

    def remove(self, container_id: str) -> None:
        with self._api(f"remove container {container_id[:12]}") as client:
            try:
                container = client.containers.get(container_id)
            except docker.errors.NotFound:
                return
            with contextlib.suppress(docker.errors.NotFound):
                if container.status in ("running", "restarting", "paused"):
                    container.stop(timeout=self._stop_grace_s)
                container.remove(force=True)

    def gpu_uuids(self, image: str) -> list[str]:
        """The host's GPUs as nvidia-smi reports them, from a throw-away container with every GPU visible (the
        NVIDIA runtime mounts the driver's nvidia-smi into it: NVIDIA container toolkit docs, sample workload)."""
        with self._api("discover its GPUs") as client:
            try:
                out = client.containers.run(image, ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                                            runtime="nvidia", remove=True, network_mode="none",
                                            environment={"NVIDIA_VISIBLE_DEVICES": "all",
                                                         "NVIDIA_DRIVER_CAPABILITIES": "utility"})
            except docker.errors.ContainerError as exc:
                raise self._fault(CAUSE_NO_GPU_TOOLS, f"nvidia-smi failed in {image}: "
                                  f"{_short(str(exc.stderr or exc))}", temporary=False) from None
        return [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]

    # --- helpers -----------------------------------------------------------------------------------------------

    @staticmethod
    def _inspect(client: docker.DockerClient, container_id: str) -> ContainerView | None:
        try:
            raw = client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return None
        state = raw.get("State") or {}
        config = raw.get("Config") or {}
        return ContainerView(
            id=str(raw.get("Id")), name=str(raw.get("Name") or "").lstrip("/"), labels=dict(config.get("Labels") or {}),
            state=str(state.get("Status") or "unknown"),
            exit_code=state.get("ExitCode") if state.get("Status") in ("exited", "dead") else None,
            error=state.get("Error") or None, image=str(config.get("Image") or ""),
            started_at=_epoch(state.get("StartedAt")) or _epoch(raw.get("Created")),
            runtime=str((raw.get("HostConfig") or {}).get("Runtime") or ""))


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text or text.startswith("0001-"):
        return None
    # Docker writes RFC 3339 with nanoseconds; Python parses at most microseconds.
    head, _, rest = text.partition(".")
    fraction = "".join(ch for ch in rest if ch.isdigit())[:6]
    zone = rest[len("".join(ch for ch in rest if ch.isdigit())):] if rest else text[len(head):]
    try:
        return datetime.fromisoformat(f"{head}.{fraction or '0'}{zone.replace('Z', '+00:00') or '+00:00'}").timestamp()
    except ValueError:
        return None


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
