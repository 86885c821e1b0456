"""Owned Docker hosts with the real parts: real sshd, real dockerd, the real worker image, the real pass.

Three "hosts" (tests/ssh_support.py): gpu-a and gpu-b are two sshd endpoints in front of one private dockerd whose
"nvidia" runtime is the stand-in in tests/fixtures/owned-hosts (no GPU: it checks the GPU UUID as the real hook does
and gives each GPU its "hardware"); gpu-c is an sshd in front of the suite's plain dockerd (no NVIDIA runtime). The
hosts adapter reaches them through the Docker SDK over Docker's ssh:// transport (paramiko), pulls the worker image
(built from worker-image/ with the CPU stand-ins, pushed to the suite's authenticated registry) by digest, and pins
each worker to one GPU. The controller, the params mirror, the git origin and the reconcile pass are the real ones,
driven as `fleet demo` drives them (tests/integration/test_serving_e2e.py shows the same loop on the local market).

Without GPUs the pinning is checked through each container's environment and labels (docker inspect).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace.docker_engine import SdkDockerEngine
from reconciler.adapters.marketplace.hosts import LABEL_FLEET, LABEL_GPU, LABEL_HOST, HostError, HostsMarketplace
from reconciler.adapters.params_mirror import ParamsMirrorServer
from reconciler.adapters.record_files import load_records
from reconciler.adapters.slot_provider import SLOT_STATE_FILE, SlotOutputs, SlotProvider
from reconciler.adapters.spec_files import load_spec
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli.demo import init_origin, make_params
from reconciler.domain.hosts import OwnedHost, gpu_machine_id
from reconciler.domain.marketplace import InstanceRequest, OfferQuery
from reconciler.flows.judge import PassResult, run_pass
from reconciler.flows.provision import Image, apply_fleet, git_orphan_recorder
from tests.docker_support import (  # noqa: F401  (pytest fixtures)
    DockerEngine,
    LocalRegistry,
    docker_engine,
    free_port,
    local_registry,
    minimal_base_image,
    start_engine,
    stop_engine,
)
from tests.loop_support import LoopWorld
from tests.ssh_support import SshHost, client_home, keygen, start_sshd
from tests.worker_support import WORKER_IMAGE

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STANDIN_RUNTIME = REPO / "tests" / "fixtures" / "owned-hosts" / "nvidia-runtime-standin"
A1, A2, B1, B2 = (f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in (0xA1, 0xA2, 0xB1, 0xB2))
UNKNOWN = "GPU-0000dead-1111-2222-3333-00000000dead"
DEADLINE_S = 150.0

#: What every GPU of the stand-in hosts runs with: the CPU stand-ins at test speed (0.25 s/proof = 14,400/h).
HOST_ENV = {"FLEET_USE_STANDINS": "1", "STANDIN_TIME_SCALE": "1", "STANDIN_SECONDS_PER_PROOF": "0.25",
            "STANDIN_SERVE_SECONDS_PER_PROOF": "0.25", "STANDIN_SRS_GIB": "1", "STANDIN_DAEMON_STARTUP_S": "0.2",
            "FLEET_DAEMON_POLL_S": "0.2", "FLEET_LOG_SHIP_INTERVAL_S": "0.3", "FLEET_PROGRESS_INTERVAL_S": "1",
            "FLEET_DIRECTIVE_POLL_S": "0.3", "FLEET_VERDICT_WAIT_S": "60", "FLEET_SERVE_CMD": "proving-load",
            "FLEET_SERVE_RETRY_S": "1", "FLEET_REPORT_RETRY_BASE_S": "0.2"}
#: The bad card: double-bit ECC errors (Xid 48), every proof panics in supraseal-c2 with CUDA error 214.
BAD_GPU_ENV = {"STANDIN_FAIL": "xid", "STANDIN_XID": "48"}


@dataclass
class Rig:
    """The hosts and what they need, shared by the module's tests (the slow parts start once)."""

    root: Path
    gpu_engine: DockerEngine
    plain_engine: DockerEngine
    registry: LocalRegistry
    image: str  # repo@sha256:...
    sshd: dict[str, SshHost]
    identity: Path
    home: Path

    @property
    def digest(self) -> str:
        return self.image.split("@", 1)[1]

    @property
    def image_login(self) -> str:
        return f"-u {self.registry.username} -p {self.registry.password} {self.registry.address}"

    def host(self, name: str, gpus: tuple[str, ...], cost: float, *, sshd: str | None = None,
             user: str = "root", address: str = "127.0.0.1", **kw: object) -> OwnedHost:
        return OwnedHost(name=name, docker=self.sshd[sshd or name].endpoint(user, address), gpu_name="RTX 4090",
                         gpu_uuids=gpus, gpu_count=len(gpus), ram_gb=256.0 * len(gpus), disk_gb=200.0 * len(gpus),
                         cost_usd_per_gpu_hour=cost, labels={"rack": "r1"}, network="host", **kw)  # type: ignore[arg-type]

    def hosts(self) -> tuple[OwnedHost, ...]:
        return (self.host("gpu-a", (A1, A2), 0.10), self.host("gpu-b", (B1, B2), 0.20),
                self.host("gpu-c", (UNKNOWN,), 0.05))

    def inspect(self, container_id: str) -> dict[str, object]:
        doc = json.loads(self.gpu_engine.text("inspect", container_id))[0]
        return {"env": dict(e.split("=", 1) for e in doc["Config"]["Env"]), "labels": doc["Config"]["Labels"],
                "runtime": doc["HostConfig"]["Runtime"], "network": doc["HostConfig"]["NetworkMode"],
                "memory": doc["HostConfig"]["Memory"], "image": doc["Config"]["Image"]}

    def fleet_containers(self) -> list[str]:
        return self.gpu_engine.text("ps", "-a", "-q", "--no-trunc", "--filter", f"label={LABEL_FLEET}").split()


@pytest.fixture(scope="module")
def rig(docker_engine: DockerEngine, local_registry: LocalRegistry,  # noqa: F811
        minimal_base_image: str) -> Iterator[Rig]:  # noqa: F811
    root = Path(tempfile.mkdtemp(prefix="fleet-hosts-", dir="/tmp"))
    # The worker image, as CI's `pulumi up` builds and pushes it; hosts pull it by digest with our credentials.
    repo = f"{local_registry.address}/fleet/worker"
    docker_engine.docker("build", "--network", "host", "--build-arg", f"BASE_IMAGE={minimal_base_image}",
                         "--build-arg", "REQUIRE_CUZK=0", "--target", "standin", "-t", f"{repo}:owned",
                         str(WORKER_IMAGE))
    docker_engine.docker("push", f"{repo}:owned")
    digests = json.loads(docker_engine.text("image", "inspect", "--format", "{{json .RepoDigests}}", f"{repo}:owned"))
    [image] = [d for d in digests if d.startswith(f"{repo}@sha256:")]
    # The GPU hosts' dockerd: its "nvidia" runtime is the stand-in, knowing the four GPUs (A2 is the bad card).
    gpus = root / "nvidia" / "gpus"
    gpus.mkdir(parents=True)
    for uuid in (A1, A2, B1, B2):
        env = {**HOST_ENV, **(BAD_GPU_ENV if uuid == A2 else {})}
        (gpus / uuid).write_text(json.dumps([f"{k}={v}" for k, v in env.items()]))
    wrapper = root / "nvidia-runtime"
    wrapper.write_text(f"#!/bin/sh\nSTANDIN_NVIDIA_DIR={root / 'nvidia'} exec {STANDIN_RUNTIME} \"$@\"\n")
    wrapper.chmod(0o755)
    (root / "daemon.json").write_text(json.dumps({"runtimes": {"nvidia": {"path": str(wrapper)}}}))
    engine_root = Path(tempfile.mkdtemp(prefix="fleet-gpu-docker-", dir="/tmp"))
    gpu_engine = start_engine(engine_root, extra_args=("--config-file", str(root / "daemon.json")))
    sshd: dict[str, SshHost] = {}
    old_home = os.environ.get("HOME")
    try:
        identity = root / "operator_ed25519"
        client_key = keygen(identity, "fleet-operator")
        for name, engine in (("gpu-a", gpu_engine), ("gpu-b", gpu_engine), ("gpu-c", docker_engine)):
            sshd[name] = start_sshd(root / f"sshd-{name}", engine.env["DOCKER_HOST"], client_key)
        # The SDK's paramiko client reads the operator's ~/.ssh (config, known_hosts): this process's HOME.
        home = client_home(root / "home", identity, {f"[127.0.0.1]:{h.port}": h.host_key_line for h in sshd.values()})
        os.environ["HOME"] = str(home)
        yield Rig(root, gpu_engine, docker_engine, local_registry, image, sshd, identity, home)
    finally:
        if old_home is not None:
            os.environ["HOME"] = old_home
        for host in sshd.values():
            host.stop()
        stop_engine(gpu_engine)


# --- the whole loop --------------------------------------------------------------------------------------------------


def spec_text(controller_url: str, params_url: str) -> str:
    doc = {
        "version": 1,
        "image": {"repository": "127.0.0.1/fleet/worker", "context": "worker-image"},
        "controller": {"url": controller_url, "log_ring_lines": 2000},
        "params": {"sector_size": "32GiB", "base_url": params_url, "fetch_timeout_minutes": 2},
        "circuit_breaker": {"distinct_machines": 3, "window_hours": 24},
        "kill_budget": {"max_fraction": 1, "min_machines": 3, "window_hours": 24},
        "serving": {"heartbeat_minutes": 0.02, "window_minutes": 0.15, "degraded_after_minutes": 0.05,
                    "min_proofs": 3, "lost_after_minutes": 0.2, "verdict_wait_minutes": 1},
        "pools": [{"name": "owned", "gpu_name": "RTX 4090", "count": 3, "min_rate_proofs_per_hour": 3600,
                   "max_price_usd_per_hour": 0.5, "min_host_ram_gb": 128, "hosts": {"labels": {"rack": "r1"}},
                   "benchmark": {"proofs": 4, "concurrency": 1, "timeout_minutes": 1}}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def hosts_text(hosts: tuple[OwnedHost, ...]) -> str:
    return yaml.safe_dump({"version": 1, "hosts": [
        {"name": h.name, "docker": h.docker, "gpu_name": h.gpu_name, "gpus": list(h.gpu_uuids), "ram_gb": h.ram_gb,
         "disk_gb": h.disk_gb, "cost_usd_per_gpu_hour": h.cost_usd_per_gpu_hour, "labels": dict(h.labels),
         "network": h.network} for h in hosts]}, sort_keys=False)


def quick_stop(host: OwnedHost) -> SdkDockerEngine:
    """The real engine adapter, with a short stop grace: the tests' workers have no proofs to finish."""
    return SdkDockerEngine(host, stop_grace_s=2)


@dataclass
class World(LoopWorld):
    deadline_s = DEADLINE_S
    poll_s = 0.5

    rig: Rig
    tmp: Path
    said: list[str] = field(default_factory=list)
    passes: list[PassResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        make_params(self.tmp / "mirror", 64 << 10)
        self.store = SqliteStore(self.tmp / "controller.db", ring_lines=2000)
        self.secret = secrets.token_bytes(32)
        self.controller = ControllerServer(self.store, self.secret, admin_token=secrets.token_hex(16),
                                           require_machine_claim=True).start()
        self.mirror = ParamsMirrorServer(self.tmp / "mirror")
        self.mirror.start()
        origin = init_origin(self.tmp, spec_text(self.controller.url, self.mirror.url))
        operator = self.tmp / "operator"
        (operator / "fleet-spec" / "hosts.yaml").write_text(hosts_text(self.rig.hosts()))
        for args in (("add", "-A"), ("commit", "-qm", "hosts: gpu-a, gpu-b, gpu-c"), ("push", "-q", "origin", "main")):
            subprocess.run(["git", "-c", "user.name=operator", "-c", "user.email=operator@example.invalid", "-C",
                            str(operator), *args], check=True, capture_output=True)
        self.bot = GitStore.clone(str(origin), self.tmp / "bot")
        self.ci = GitStore.clone(str(origin), self.tmp / "ci")
        spec = load_spec(self.ci.workdir / "fleet-spec" / "fleet.yaml")
        self.market = HostsMarketplace(spec.hosts, quick_stop, notify=self.said.append)
        self.provider = SlotProvider(self.market, self.secret, image_login=self.rig.image_login,
                                     on_destroyed=lambda out: self.store.mark_destroyed(out.instance_id,
                                                                                         datetime.now(UTC)))
        self.state_path = self.tmp / "state" / SLOT_STATE_FILE
        self.image = Image(self.rig.image, self.rig.digest)
        self.apply_lines: list[str] = []

    def apply(self, *, sweep: bool = False) -> None:
        self.ci.sync()
        spec = load_spec(self.ci.workdir / "fleet-spec" / "fleet.yaml")
        recorder = git_orphan_recorder(self.ci, spec.name, echo=self.apply_lines.append) if sweep else None
        apply_fleet(spec, load_records(self.ci.workdir / "fleet-spec"), self.provider, self.state_path, self.image,
                    datetime.now(UTC), echo=self.apply_lines.append, recorder=recorder, orphan_grace_s=0.0)

    def step(self) -> PassResult:
        self.apply()
        result = run_pass(GitFleetTree(self.bot), self.store, datetime.now(UTC),
                          desired_image_digest=self.image.digest, directive_sink=self.store)
        assert result.ok, result.headline()
        self.passes.append(result)
        return result

    def verdicts(self, machine_id: str) -> list[str]:
        record = self.records().machines.get(machine_id)
        return [b.verdict for b in record.benchmarks] if record else []

    def serving(self, machine_id: str) -> bool:
        """The GPU's worker serves and the controller hears its heartbeats."""
        return any(r.machine_id == machine_id and r.first("serve", "started") is not None and r.destroyed_at is None
                   and sum(1 for e in r.events if e.phase == "serve" and "heartbeat" in e.details) >= 2
                   for r in self.store.reports())

    def slots(self) -> dict[str, SlotOutputs]:
        from reconciler.adapters.slot_provider import load_slot_state

        return load_slot_state(self.state_path)

    def explain(self) -> str:
        lines = [f"passes: {[p.headline() for p in self.passes[-4:]]}", *self.apply_lines[-20:], *self.said]
        for r in self.store.reports():
            lines.append(f"{r.instance_id} {r.machine_id}: destroyed={r.destroyed_at} "
                         f"{sorted({(e.phase, e.status) for e in r.events})}")
            lines += [f"    | {line}" for line in r.log_tail if "serve-cmd" not in line][-12:]
        for cid in self.rig.fleet_containers():
            out = self.rig.gpu_engine.docker("logs", "--tail", "400", cid, check=False)
            text = (out.stdout + out.stderr).decode(errors="replace").splitlines()
            lines += [f"--- docker logs {cid[:12]}", *[t for t in text if "serve-cmd" not in t][-25:]]
        return "\n".join(lines)

    def close(self) -> None:
        for instance in self.market.list_instances():
            with contextlib.suppress(Exception):
                self.market.destroy_instance(instance.contract_id)
        self.bot.close()
        self.ci.close()
        self.controller.stop()
        self.mirror.stop()
        self.store.close()


@pytest.fixture
def world(rig: Rig, tmp_path: Path) -> Iterator[World]:
    w = World(rig, tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_each_gpu_is_benchmarked_judged_and_recorded_and_a_bad_one_is_excluded_while_its_sibling_serves(
        world: World, rig: Rig) -> None:
    world.run_until("every GPU judged: A1 and B1 ok, A2 bad", lambda w: (
        w.verdicts(gpu_machine_id("gpu-a", A1)) == ["ok"] and w.verdicts(gpu_machine_id("gpu-b", B1)) == ["ok"]
        and w.verdicts(gpu_machine_id("gpu-a", A2)) != []))
    a1, a2, b1, b2 = (gpu_machine_id(h, u) for h, u in (("gpu-a", A1), ("gpu-a", A2), ("gpu-b", B1), ("gpu-b", B2)))
    # gpu-c is the cheapest host, but its Docker has no NVIDIA runtime: one line, and its GPU was never offered.
    assert any(line.startswith("host gpu-c: Docker has no NVIDIA runtime") and "[no-nvidia-runtime]" in line
               for line in world.said), world.said
    # Each worker ran pinned to its own GPU, from the image pinned by digest, labelled as a rented instance is.
    pinned = {rig.inspect(cid)["labels"][LABEL_GPU]: rig.inspect(cid) for cid in rig.fleet_containers()}  # type: ignore[index]
    assert {A1, B1} <= set(pinned) <= {A1, A2, B1, B2}  # A2's may already be replaced by one on B2
    for uuid, seen in pinned.items():
        env, labels = seen["env"], seen["labels"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid and seen["runtime"] == "nvidia"  # type: ignore[index]
        assert seen["image"] == rig.image and seen["network"] == "host"
        assert labels[LABEL_HOST] in ("gpu-a", "gpu-b") and labels[LABEL_FLEET].startswith("gpu-fleet/main/owned-")  # type: ignore[index]
        assert env["FLEET_MACHINE_ID"] == gpu_machine_id(labels[LABEL_HOST], uuid)  # type: ignore[index]
    # The bad card is recorded bad, by itself: its sibling on the same host passed and serves.
    record = world.records().machines[a2]
    # (its slot may have been rented on A2 once more before the verdict landed: that worker's stop is recorded too)
    [entry] = [e for e in record.benchmarks if e.marks_bad]
    assert (record.status, entry.verdict, entry.blame, entry.signature) == ("bad", "benchmark-error", "machine",
                                                                             "gpu-ecc"), record.benchmarks
    assert record.host_id == "gpu-a" and world.records().machines[a1].status == "ok"
    # The next apply replaces the bad GPU's slot onto a free GPU (B2); A1 and B1 keep serving.
    world.run_until("the bad GPU's slot runs on B2; A1 and B1 serve", lambda w: (
        any(s.machine_id == b2 for s in w.slots().values()) and w.serving(a1) and w.serving(b1)))
    assert a2 not in {s.machine_id for s in world.slots().values()}
    # `fleet why <host>/<GPU UUID>` tells the bad card's story from git.
    why = subprocess.run([sys.executable, "-m", "reconciler.cli", "why", f"gpu-a/{A2}", "--repo",
                          str(world.bot.workdir)], capture_output=True, text=True, timeout=60)
    assert why.returncode == 0, why.stderr
    assert a2 in why.stdout and "benchmark-error" in why.stdout and "machine" in why.stdout
    assert world.secret.hex() not in why.stdout
    # `fleet why <host>`: the host's GPUs, and no host verdict for one bad card.
    host = subprocess.run([sys.executable, "-m", "reconciler.cli", "why", "gpu-a", "--repo", str(world.bot.workdir)],
                          capture_output=True, text=True, timeout=60)
    assert host.returncode == 0, host.stderr
    assert host.stdout.startswith("host gpu-a: ") and A2 in host.stdout
    assert "each card answers for itself" in host.stdout


def test_the_sweep_removes_fleet_containers_no_slot_owns_on_every_host(world: World, rig: Rig) -> None:
    # A killed run left a worker behind on gpu-b (the fleet's label, no slot): the sweep removes it, with evidence.
    orphan = world.market.create_instance(gpu_machine_id("gpu-b", B2), InstanceRequest(
        image=rig.image, disk_gb=50, label="gpu-fleet/main/owned-7-0abcde", env={"FLEET_AFTER_BENCH": "exit"},
        image_login=rig.image_login))
    assert world.market.get_instance(orphan) is not None
    world.apply(sweep=True)
    assert world.market.get_instance(orphan) is None
    assert any("destroy orphan instance " + orphan in line for line in world.apply_lines), world.apply_lines
    world.ci.sync()
    assert (world.ci.workdir / "fleet-spec" / "marketplace" / "destroyed" / f"{orphan}.yaml").is_file()


# --- faults: one line naming host and cause, nothing destroyed on a failed look, no credential printed --------------


def _market(rig: Rig, *hosts: OwnedHost) -> tuple[HostsMarketplace, list[str]]:
    said: list[str] = []
    return HostsMarketplace(hosts, quick_stop, notify=said.append), said


def test_host_faults_each_give_one_clear_line(rig: Rig, tmp_path: Path) -> None:
    query = OfferQuery(gpu_name="RTX 4090", owned_hosts=True)
    a = rig.host("gpu-a", (A1,), 0.1)
    # A worker already running on gpu-a: no failed look below may remove it.
    market, said = _market(rig, a)
    survivor = market.create_instance(gpu_machine_id("gpu-a", A1), InstanceRequest(
        image=rig.image, disk_gb=50, label="gpu-fleet/faults/owned-0-0f0f0f", env={"FLEET_AFTER_BENCH": "exit"},
        image_login=rig.image_login))
    try:
        # unreachable: nothing listens on the port
        down = replace(a, name="gpu-down", docker=f"ssh://root@127.0.0.1:{free_port()}")
        market, said = _market(rig, down)
        assert market.search_offers(query) == []
        assert said == [said[0]] and said[0].startswith("host gpu-down: cannot connect to 127.0.0.1:") \
            and said[0].endswith("[unreachable]")
        # SSH auth refused: the operator's ~/.ssh names a key the host does not accept
        stranger = tmp_path / "stranger_ed25519"
        keygen(stranger, "stranger")
        with home(client_home(tmp_path / "h1", stranger, known(rig))):
            market, said = _market(rig, a)
            assert market.list_instances() == []  # a failed look lists nothing: the sweep cannot act on it
            [line] = said
            assert line.startswith("host gpu-a: 127.0.0.1:") and "refused SSH authentication for user root" in line
            assert line.endswith("[ssh-auth-refused]")
        # a host key that changed since known_hosts was written
        other = tmp_path / "other_host_key"
        other_key = " ".join(keygen(other, "impostor").split()[:2])
        with home(client_home(tmp_path / "h2", rig.identity, {**known(rig),
                                                              f"[127.0.0.1]:{rig.sshd['gpu-a'].port}": other_key})):
            market, said = _market(rig, a)
            seen = market.get_instance(survivor)
            assert seen is not None and seen.status == "unknown"  # never "gone" on a failed look
            [line] = said
            assert "differs from the one in known_hosts" in line and line.endswith("[host-key-changed]")
        # an unknown host key is not trusted either
        with home(client_home(tmp_path / "h3", rig.identity, {})):
            market, said = _market(rig, a)
            with pytest.raises(HostError, match=r"\[host-key-unknown\]"):
                market.destroy_instance(survivor)
        # a GPU UUID the host does not have: the runtime refuses it; nothing is left behind
        ghost = rig.host("gpu-a", (UNKNOWN,), 0.1)
        market, said = _market(rig, ghost)
        before = set(rig.fleet_containers())
        with pytest.raises(Exception, match=r"host gpu-a: .*unknown device.*\[unknown-gpu\]"):
            market.create_instance(gpu_machine_id("gpu-a", UNKNOWN), InstanceRequest(
                image=rig.image, disk_gb=50, label="gpu-fleet/faults/owned-1-0f0f0f", env={},
                image_login=rig.image_login))
        assert set(rig.fleet_containers()) == before
        # a registry the host cannot pull from (refused credentials): the password is never printed
        b = rig.host("gpu-b", (B1,), 0.2)
        market, said = _market(rig, b)
        rig.gpu_engine.docker("rmi", "-f", rig.image, check=False)  # so the host has to pull
        wrong = f"-u {rig.registry.username} -p wrong-{rig.registry.password} {rig.registry.address}"
        with pytest.raises(Exception, match=r"host gpu-b: cannot pull .*\[pull-refused\]") as err:
            market.create_instance(gpu_machine_id("gpu-b", B1), InstanceRequest(
                image=rig.image, disk_gb=50, label="gpu-fleet/faults/owned-2-0f0f0f", env={}, image_login=wrong))
        assert rig.registry.password not in str(err.value) and not any(rig.registry.password in s for s in said)
        # Docker without the NVIDIA runtime
        c = rig.host("gpu-c", (UNKNOWN,), 0.05)
        market, said = _market(rig, c)
        assert market.search_offers(query) == [] and said[0].endswith("[no-nvidia-runtime]")
        # Through every fault above, the running worker was never touched.
        market, _ = _market(rig, a)
        seen = market.get_instance(survivor)
        assert seen is not None and seen.status in ("running", "exited")
    finally:
        _market(rig, a)[0].destroy_instance(survivor)


def known(rig: Rig) -> dict[str, str]:
    return {f"[127.0.0.1]:{h.port}": h.host_key_line for h in rig.sshd.values()}


@contextlib.contextmanager
def home(path: Path) -> Iterator[None]:
    old = os.environ["HOME"]
    os.environ["HOME"] = str(path)
    try:
        yield
    finally:
        os.environ["HOME"] = old
