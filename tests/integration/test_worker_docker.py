"""The real worker Dockerfile: built by a real engine, pushed to a real registry, pulled by digest, run.

Uses tests/docker_support.py (private dockerd on vfs, Debian docker-registry with htpasswd auth, a base
image assembled from this host's binaries: nothing from Docker Hub). The container runs the real
entrypoint with the CPU stand-ins (FLEET_USE_STANDINS=1) on the host network, so it reaches the test's
controller receiver and params mirror on 127.0.0.1; every body it sends is schema-checked there.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker_support import (  # noqa: F401  (pytest fixtures)
    DockerEngine,
    LocalRegistry,
    docker_engine,
    local_registry,
    minimal_base_image,
)
from tests.worker_support import INSTANCE_ID, WORKER_IMAGE, WorkerBench, bench_world, token_for

pytestmark = pytest.mark.docker

IMAGE_VERSION = "test-0.1.0+docker"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[WorkerBench]:
    yield from bench_world(tmp_path)


def test_worker_image_builds_pushes_pulls_by_digest_and_reports(
    docker_engine: DockerEngine,  # noqa: F811
    local_registry: LocalRegistry,  # noqa: F811
    minimal_base_image: str,  # noqa: F811
    world: WorkerBench,
) -> None:
    repo = f"{local_registry.address}/fleet/worker"
    tag = f"{repo}:build"
    docker_engine.docker(
        "build", "--network", "host", "--build-arg", f"BASE_IMAGE={minimal_base_image}",
        "--build-arg", f"IMAGE_VERSION={IMAGE_VERSION}",
        "--build-arg", "REQUIRE_CUZK=0", "--target", "standin", "-t", tag, str(WORKER_IMAGE),
    )
    labels = json.loads(docker_engine.text("image", "inspect", "--format", "{{json .Config.Labels}}", tag))
    assert labels["org.opencontainers.image.version"] == IMAGE_VERSION
    assert labels["io.gpu-fleet.worker-protocol"] == "1"
    assert labels["io.gpu-fleet.cuzk"] == "standin"

    # Push to the authenticated registry; pin by digest; forget the local copy; pull it back by digest.
    assert local_registry.anonymous_status() == 401
    docker_engine.docker("push", tag)
    repo_digests = json.loads(docker_engine.text("image", "inspect", "--format", "{{json .RepoDigests}}", tag))
    [pinned] = [d for d in repo_digests if d.startswith(f"{repo}@sha256:")]
    docker_engine.docker("rmi", tag)
    assert docker_engine.docker("image", "inspect", pinned, check=False).returncode != 0
    docker_engine.docker("pull", pinned)
    pulled_labels = json.loads(docker_engine.text("image", "inspect", "--format", "{{json .Config.Labels}}", pinned))
    assert pulled_labels == labels

    digest = pinned.split("@", 1)[1]
    env = world.env(
        FLEET_USE_STANDINS="1",
        FLEET_IMAGE_DIGEST=digest,
        FLEET_BENCH_PROOFS="4",
        # In-container paths (the image's defaults), not the host test's tmp dirs.
        FLEET_PARAMS_DIR="",
        FLEET_STATE_DIR="",
        STANDIN_STATE_DIR="",
        PATH="",
        HOME="",
        FAKE_ARIA2C_LOG="",
        FAKE_SSH_LOG="",
        # The container's own cgroup sizes the daemon's budget; a small stand-in SRS fits any test host.
        FLEET_CGROUP_DIR="",
        STANDIN_CGROUP_DIR="",
        STANDIN_SRS_GIB="1",
    )
    env_args = [arg for key, value in sorted(env.items()) for arg in ("-e", f"{key}={value}")]
    run = docker_engine.docker(
        "run", "--rm", "--network", "host", *env_args, pinned, timeout_s=300, check=False
    )
    output = run.stdout.decode(errors="replace") + run.stderr.decode(errors="replace")
    rx = world.receiver
    assert run.returncode == 0, output[-5000:]
    assert rx.problems == [], rx.problems
    assert all(token_for(INSTANCE_ID).encode() not in r.raw for r in rx.all())

    [register] = [r.body for r in rx.accepted("register")]
    assert register["image_version"] == IMAGE_VERSION
    assert register["image_digest"] == digest
    assert [s for s in rx.phase_statuses() if s[1] != "progress"][-2:] == [("report", "started"), ("report", "done")]
    [result] = rx.results()
    assert (result["outcome"], result["completed"], result["requested"]) == ("completed", 4, 4)
    assert result["image_digest"] == digest
    lines = rx.log_lines()
    assert any("FLEET_USE_STANDINS=1" in line for line in lines)
    assert any("[gpu-fleet stand-in] cuzk-bench" in line for line in lines)
    assert result["memory"]["source"] in ("cgroup-v2", "cgroup-v1", "host")
    assert result["warmup"]["outcome"] == "completed"


def test_docker_support_base_rootfs_runs_the_tools(
    docker_engine: DockerEngine,  # noqa: F811
    minimal_base_image: str,  # noqa: F811
) -> None:
    """The assembled base really has working bash/curl/jq/b2sum (libraries resolved), no package manager."""
    probe = docker_engine.docker(
        "run", "--rm", "--network", "none", minimal_base_image, "bash", "-c",
        "jq -n '{a: 1}' | jq -c . && printf x | b2sum | cut -c1-16 && curl --version | head -n1 "
        "&& timeout 5 sleep 0.1 && ! command -v apt-get",
        check=False,
    )
    out = probe.stdout.decode()
    assert probe.returncode == 0, out + probe.stderr.decode()
    lines = out.splitlines()
    assert lines[0] == '{"a":1}'
    assert lines[1] == subprocess.run(["sh", "-c", "printf x | b2sum | cut -c1-16"], capture_output=True,
                                      text=True, check=True).stdout.strip()
    assert lines[2].startswith("curl ")


def test_production_build_refuses_a_base_without_cuzk(
    docker_engine: DockerEngine,  # noqa: F811
    minimal_base_image: str,  # noqa: F811
) -> None:
    # REQUIRE_CUZK=1 (a base meant to carry a cuzk build): a base image without one must fail here, once,
    # rather than on every machine the fleet rents. (The default target builds cuzk itself from curio.)
    proc = docker_engine.docker(
        "build", "--network", "host", "--build-arg", f"BASE_IMAGE={minimal_base_image}",
        "--build-arg", "REQUIRE_CUZK=1", "--target", "standin",
        "-t", "fleet/worker:no-cuzk", str(WORKER_IMAGE), check=False,
    )
    output = (proc.stdout + proc.stderr).decode(errors="replace")
    assert proc.returncode != 0, output
    assert "base image lacks: cuzk-daemon(or cuzk) cuzk-bench" in output
