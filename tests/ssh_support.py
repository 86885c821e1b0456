"""Real OpenSSH servers on 127.0.0.1 in front of private dockerds: "owned hosts" for the hosts adapter's tests.

Place in the flow: tests/integration/test_owned_hosts.py reaches each "host" the way production does, Docker's own
`ssh://user@host:port` transport (the Docker SDK's paramiko client, which runs `docker system dial-stdio` on the
host). Each `SshHost` is Debian's sshd (openssh-server) started as a throw-away configuration on a free port: its
own host key, one authorized client key, no passwords, no PAM, and `SetEnv DOCKER_HOST=...` so the session's
`docker` talks to that host's private dockerd (sshd_config(5), SetEnv: OpenSSH >= 7.8). `client_home` writes the
operator's side: ~/.ssh/config (IdentityFile) and ~/.ssh/known_hosts, as an operator sets them up once.

Keys come from `ssh-keygen` (openssh-client). If sshd cannot start: FLEET_REQUIRE_SSH=1 (CI) fails the test;
otherwise it is skipped with the reason and sshd's own words.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docker_support import free_port

REQUIRE_ENV = "FLEET_REQUIRE_SSH"
SSHD = "/usr/sbin/sshd"


def unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but sshd is unavailable: {reason}", pytrace=False)
    pytest.skip(f"SSHD UNAVAILABLE, owned-host tests skipped: {reason}")


def keygen(path: Path, comment: str = "fleet-test") -> str:
    """A throw-away ed25519 key pair at `path` (+ .pub); returns the public key line."""
    if shutil.which("ssh-keygen") is None:
        unavailable("`ssh-keygen` is not installed (apt-get install openssh-client)")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                   capture_output=True)
    return Path(f"{path}.pub").read_text().strip()


@dataclass
class SshHost:
    """One sshd on 127.0.0.1:`port` whose sessions reach `docker_host`."""

    root: Path
    port: int
    host_key_line: str  # "ssh-ed25519 AAAA..." as known_hosts wants it
    process: subprocess.Popen[bytes]

    def endpoint(self, user: str = "root", address: str = "127.0.0.1") -> str:
        return f"ssh://{user}@{address}:{self.port}"

    def log_tail(self) -> str:
        try:
            return (self.root / "sshd.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no sshd log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_sshd(root: Path, docker_host: str, authorized_key: str, wait_s: float = 20) -> SshHost:
    if not Path(SSHD).is_file():
        unavailable(f"{SSHD} is not installed (apt-get install openssh-server)")
    if os.geteuid() != 0:
        unavailable("sshd needs root to switch users (CI and this workplace run as root)")
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory (Debian)
    host_key_line = keygen(root / "host_ed25519", "fleet-test-host")
    (root / "authorized_keys").write_text(authorized_key + "\n")
    port = free_port()
    (root / "sshd_config").write_text(
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {root / 'host_ed25519'}\n"
        f"PidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "AllowTcpForwarding no\n"
        "X11Forwarding no\n"
        f"SetEnv DOCKER_HOST={docker_host}\n"
        "LogLevel VERBOSE\n")
    log = (root / "sshd.log").open("wb")
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    host = SshHost(root, port, " ".join(host_key_line.split()[:2]), process)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-2.0-"):
                    return host
        except OSError:
            pass
        time.sleep(0.1)
    tail = host.log_tail()
    host.stop()
    unavailable(f"sshd did not come up on 127.0.0.1:{port} (exit {process.poll()}): {tail}")
    raise AssertionError("unreachable")


def client_home(home: Path, identity: Path, known: dict[str, str]) -> Path:
    """An operator's ~/.ssh for the SDK's paramiko client: `known` maps "[host]:port" -> "ssh-ed25519 AAAA..."."""
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    (ssh / "config").write_text(f"Host 127.0.0.1 localhost\n  IdentityFile {identity}\n")
    (ssh / "known_hosts").write_text("".join(f"{where} {key}\n" for where, key in known.items()))
    return home
