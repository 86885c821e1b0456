"""Real docker engine and a real image registry on 127.0.0.1, for tests (reusable pytest fixtures).

Place in the flow: tests that build/push/pull/run images (the worker image test; infra tests may reuse
`docker_engine` and `local_registry`) import these fixtures:

    from tests.docker_support import docker_engine, local_registry, minimal_base_image  # noqa: F401

`docker_engine` starts a private dockerd (vfs storage, no iptables, no bridge; its own data/exec root
and unix socket in a tmp dir) once per session and stops it afterwards; the client talks to it through
`DockerEngine.env` (DOCKER_HOST, a private DOCKER_CONFIG so logins never touch ~/.docker, legacy
builder). `local_registry` runs Debian's `docker-registry` on 127.0.0.1:<free port> with htpasswd
(bcrypt) auth; 127.0.0.1 registries are insecure-allowed by default in dockerd. `minimal_base_image`
imports a tiny rootfs assembled from this host's binaries (bash, curl, jq, coreutils' b2sum/timeout/
sleep, GNU find + their shared libs, busybox for the rest), so nothing comes from Docker Hub.

If the engine cannot start: FLEET_REQUIRE_DOCKER=1 (CI) fails the test; otherwise it is skipped with
the reason and the tail of dockerd's log.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE_ENV = "FLEET_REQUIRE_DOCKER"
# GNU find: serve.sh lists its event queue with `find -printf` (busybox's find has no -printf, so a worker on a
# busybox-only base would never send a serve event; production bases are CUDA images with findutils).
BASE_BINARIES = ("bash", "curl", "jq", "b2sum", "timeout", "sleep", "find")


def docker_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def unavailable(reason: str) -> None:
    """Fail when CI demands docker, skip (loudly) otherwise."""
    if docker_required():
        pytest.fail(f"{REQUIRE_ENV}=1 but the docker engine is unavailable: {reason}", pytrace=False)
    pytest.skip(f"DOCKER ENGINE UNAVAILABLE, docker tests skipped: {reason}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DockerEngine:
    root: Path
    process: subprocess.Popen[bytes]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        return self.root / "dockerd.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no dockerd log)"

    def docker(
        self, *args: str, input: bytes | None = None, timeout_s: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run(
            ["docker", *args], env=self.env, input=input, capture_output=True, timeout=timeout_s, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args)} exited {proc.returncode}\n"
                f"{proc.stdout.decode(errors='replace')[-3000:]}\n{proc.stderr.decode(errors='replace')[-3000:]}"
            )
        return proc

    def text(self, *args: str, timeout_s: float = 600) -> str:
        return self.docker(*args, timeout_s=timeout_s).stdout.decode().strip()


def start_engine(root: Path, wait_s: float = 60, extra_args: tuple[str, ...] = ()) -> DockerEngine:
    """A private dockerd under `root`; `extra_args` add dockerd flags (e.g. a --config-file with runtimes)."""
    for tool in ("dockerd", "docker"):
        if shutil.which(tool) is None:
            unavailable(f"`{tool}` is not installed (apt-get install docker.io)")
    sock = root / "docker.sock"
    log = (root / "dockerd.log").open("wb")
    process = subprocess.Popen(
        [
            "dockerd",
            "--storage-driver=vfs",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--data-root={root / 'data'}",
            f"--exec-root={root / 'exec'}",
            f"--pidfile={root / 'dockerd.pid'}",
            f"--host=unix://{sock}",
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    (root / "client").mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": str(root / "client"),
        "DOCKER_HOST": f"unix://{sock}",
        "DOCKER_CONFIG": str(root / "client"),
        "DOCKER_BUILDKIT": "0",  # the legacy builder needs no buildx plugin and no frontend image
    }
    engine = DockerEngine(root, process, env)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        probe = engine.docker("version", "--format", "{{.Server.Version}}", timeout_s=10, check=False)
        if probe.returncode == 0:
            return engine
        time.sleep(0.5)
    tail = engine.log_tail()
    stop_engine(engine)
    unavailable(f"dockerd did not come up within {wait_s:.0f}s (exit {process.poll()}); log tail:\n{tail}")
    raise AssertionError("unreachable")


def stop_engine(engine: DockerEngine) -> None:
    if engine.process.poll() is None:
        engine.process.send_signal(signal.SIGTERM)
        try:
            engine.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            engine.process.kill()
            engine.process.wait(timeout=10)
    # dockerd leaves its network namespace (and, on a crash, other) mounts under its roots.
    with open("/proc/mounts") as mounts:
        ours = [line.split()[1] for line in mounts if line.split()[1].startswith(str(engine.root))]
    for mount_point in sorted(ours, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)
    shutil.rmtree(engine.root, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    # A short path: unix socket paths (dockerd's and containerd's) are limited to 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="fleet-docker-", dir="/tmp"))
    engine = start_engine(root)
    try:
        yield engine
    finally:
        stop_engine(engine)


@dataclass
class LocalRegistry:
    address: str  # 127.0.0.1:<port>
    username: str
    password: str
    process: subprocess.Popen[bytes]
    root: Path

    def login(self, engine: DockerEngine) -> None:
        engine.docker(
            "login", "--username", self.username, "--password-stdin", self.address, input=self.password.encode()
        )

    def anonymous_status(self, path: str = "/v2/_catalog") -> int:
        """HTTP status of an unauthenticated request (401 proves auth is enforced)."""
        try:
            with urllib.request.urlopen(f"http://{self.address}{path}", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


def start_registry(root: Path, wait_s: float = 30) -> LocalRegistry:
    for tool in ("docker-registry", "htpasswd"):
        if shutil.which(tool) is None:
            unavailable(f"`{tool}` is not installed (apt-get install docker-registry apache2-utils)")
    username, password = "fleet-ci", secrets.token_hex(12)
    htpasswd = subprocess.run(
        ["htpasswd", "-Bbn", username, password], capture_output=True, text=True, check=True
    ).stdout
    (root / "htpasswd").write_text(htpasswd)
    port = free_port()
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {root / 'data'}\n"
        "  delete:\n    enabled: true\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        f"  secret: {secrets.token_hex(16)}\n"
        "auth:\n"
        f"  htpasswd:\n    realm: fleet-test-registry\n    path: {root / 'htpasswd'}\n"
    )
    log = (root / "registry.log").open("wb")
    process = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    registry = LocalRegistry(f"127.0.0.1:{port}", username, password, process, root)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if registry.anonymous_status("/v2/") == 401:
                return registry
        except OSError:
            pass
        time.sleep(0.2)
    tail = (root / "registry.log").read_text(errors="replace")[-2000:]
    stop_registry(registry)
    unavailable(f"docker-registry did not come up on 127.0.0.1:{port}; log tail:\n{tail}")
    raise AssertionError("unreachable")


def stop_registry(registry: LocalRegistry) -> None:
    if registry.process.poll() is None:
        registry.process.terminate()
        try:
            registry.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            registry.process.kill()
            registry.process.wait(timeout=10)


@pytest.fixture(scope="session")
def local_registry(docker_engine: DockerEngine) -> Iterator[LocalRegistry]:
    root = Path(tempfile.mkdtemp(prefix="fleet-registry-", dir="/tmp"))
    registry = start_registry(root)
    try:
        registry.login(docker_engine)
        yield registry
    finally:
        stop_registry(registry)
        shutil.rmtree(root, ignore_errors=True)


def shared_libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])  # the dynamic loader
    return libs


def assemble_rootfs(root: Path, binaries: tuple[str, ...] = BASE_BINARIES) -> Path:
    """A minimal Linux rootfs from this host: the given binaries + their libs, busybox for the rest."""
    for directory in ("bin", "usr/bin", "etc", "tmp", "var/tmp", "root", "dev", "proc", "sys"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var/tmp").chmod(0o1777)
    missing = [b for b in (*binaries, "busybox", "ldd") if shutil.which(b) is None]
    if missing:
        unavailable(f"cannot assemble a base image: host lacks {', '.join(missing)} (apt-get install busybox-static)")
    files: set[str] = set()
    for name in binaries:
        path = str(Path(shutil.which(name) or name).resolve())
        files.add(path)
        files.update(shared_libraries(path))
        target = root / "usr/bin" / name
        shutil.copy2(path, target)
    for path in sorted(files):
        destination = root / path.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)  # follows symlinks: the real file under the linked name
    busybox = shutil.which("busybox") or "busybox"
    shutil.copy2(busybox, root / "bin/busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if not (root / "bin" / applet).exists() and not (root / "usr/bin" / applet).exists():
            (root / "bin" / applet).symlink_to("busybox")
    if not (root / "usr/bin/env").exists():
        (root / "usr/bin/env").symlink_to("/bin/busybox")  # `#!/usr/bin/env bash` scripts
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    return root


@pytest.fixture(scope="session")
def minimal_base_image(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Tag of a tiny base image imported from a host-assembled rootfs (no registry, no Docker Hub)."""
    rootfs = assemble_rootfs(tmp_path_factory.mktemp("rootfs"))
    tarball = rootfs.parent / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    tag = "fleet-test-base:host"
    docker_engine.docker("import", str(tarball), tag)
    return tag
