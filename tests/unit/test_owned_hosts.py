"""Owned Docker hosts: the inventory file, the fit of pools to hosts, and the hosts adapter over our fake of its
Docker port (the real SDK through a real sshd and dockerd: tests/integration/test_owned_hosts.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.adapters.marketplace.combined import CombinedMarketplace
from reconciler.adapters.marketplace.hosts import (
    CAUSE_NO_NVIDIA_RUNTIME,
    CAUSE_UNREACHABLE,
    LABEL_FLEET,
    LABEL_GPU,
    LABEL_MACHINE,
    HostError,
    HostsMarketplace,
)
from reconciler.adapters.slot_provider import SlotProvider
from reconciler.adapters.spec_files import check_hosts_text, check_spec_text, cross_problems, load_spec
from reconciler.domain.hosts import (
    HostSelector,
    OwnedHost,
    excluded_by_hosts,
    gpu_machine_id,
    host_of_machine,
    host_story,
    host_verdicts,
    machine_id_of_argument,
)
from reconciler.domain.marketplace import InstanceRequest, OfferQuery
from reconciler.domain.planner import REASON_MACHINE_BAD, ObservedSlot, Replace, plan
from reconciler.domain.ranking import mismatch, offer_query
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet
from reconciler.domain.slots import NoOfferError, SlotInputs
from reconciler.domain.spec import BenchmarkSettings, ParamsSettings, PoolSpec
from tests.fakes import FakeDockerEngine, FakeMarket

U = [f"GPU-{i:08x}-0000-0000-0000-{i:012x}" for i in range(1, 7)]
DIGEST = "sha256:" + "4" * 64
IMAGE = f"127.0.0.1:5000/fleet/worker@{DIGEST}"
SECRET = b"controller-secret-0123456789"

HOSTS_YAML = f"""
version: 1
hosts:
  - name: gpu-a
    docker: ssh://fleet@10.0.0.5
    gpu_name: RTX 4090
    gpus: [{U[0]}, {U[1]}]
    ram_gb: 512
    disk_gb: 2000
    cost_usd_per_gpu_hour: 0.18
    labels: {{site: fra}}
    network: host
  - name: gpu-b
    docker: ssh://fleet@10.0.0.6:2222
    gpu_name: RTX 4090
    gpus: 4
    ram_gb: 512
    disk_gb: 1000
    cost_usd_per_gpu_hour: 0.2
    labels: {{site: ams}}
"""

SPEC = """
version: 1
image: {repository: ghcr.io/example/worker}
controller: {url: https://controller.example}
pools:
  - name: owned
    gpu_name: RTX 4090
    count: 2
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.3
    hosts: {labels: {site: LABEL}}
    benchmark: {proofs: 4, concurrency: 1}
"""


def hosts() -> tuple[OwnedHost, ...]:
    found, problems = check_hosts_text(HOSTS_YAML, "hosts.yaml")
    assert found is not None, problems
    return found


def pool(**labels: str) -> PoolSpec:
    return PoolSpec(name="owned", gpu_name="RTX 4090", count=2, min_rate_proofs_per_hour=40,
                    max_price_usd_per_hour=0.3, min_host_ram_gb=100, hosts=HostSelector(labels),
                    benchmark=BenchmarkSettings(proofs=4, concurrency=1, after="exit"))


def inputs(p: PoolSpec, slot: str = "owned-0", **kw: object) -> SlotInputs:
    base = SlotInputs(slot=slot, pool=p, image=IMAGE, image_digest=DIGEST, controller_url="https://controller.example",
                      params=ParamsSettings(), priors={"RTX 4090": 50.0})
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.fixture
def engines() -> dict[str, FakeDockerEngine]:
    return {"gpu-a": FakeDockerEngine("gpu-a"), "gpu-b": FakeDockerEngine("gpu-b", gpus=U[2:6])}


@pytest.fixture
def market(engines: dict[str, FakeDockerEngine]) -> HostsMarketplace:
    said: list[str] = []
    m = HostsMarketplace(hosts(), lambda h: engines[h.name], notify=said.append)
    m.said = said  # type: ignore[attr-defined]
    return m


# --- the inventory ---------------------------------------------------------------------------------------------------


def test_inventory_parses_declared_and_counted_gpus() -> None:
    a, b = hosts()
    assert (a.name, a.gpu_uuids, a.gpu_count, a.network, a.ram_per_gpu_gb) == ("gpu-a", (U[0], U[1]), 2, "host", 256)
    assert (b.gpu_uuids, b.gpu_count, b.state, b.gpu_access) == ((), 4, "active", "runtime")


@pytest.mark.parametrize(("text", "path", "says"), [
    (HOSTS_YAML.replace(U[0], "GPU-nope"), "$.hosts[0].gpus[0]", "expected text matching ^GPU-"),
    (HOSTS_YAML.replace("ssh://fleet@10.0.0.6:2222", "tcp://10.0.0.6:2376"), "$.hosts[1].docker", "needs tls"),
    (HOSTS_YAML.replace("name: gpu-b", "name: gpu-a"), "$.hosts[1].name", "duplicate host name 'gpu-a'"),
    (HOSTS_YAML.replace("ssh://fleet@10.0.0.6:2222", "ssh://fleet@10.0.0.5"), "$.hosts[1].docker", "one Docker"),
    (HOSTS_YAML.replace("    cost_usd_per_gpu_hour: 0.2\n", ""), "$.hosts[1]", "cost_usd_per_gpu_hour"),
    (HOSTS_YAML.replace("network: host", "network: overlay"), "$.hosts[0].network", "bridge, host"),
])
def test_inventory_problems_name_the_field(text: str, path: str, says: str) -> None:
    found, problems = check_hosts_text(text, "hosts.yaml")
    assert found is None
    assert any(p.json_path == path and says in p.message for p in problems), problems


def test_validate_checks_both_files_and_names_a_pool_no_host_can_serve(tmp_path: Path) -> None:
    spec, problems = check_spec_text(SPEC.replace("LABEL", "lon"), "fleet.yaml")
    assert spec is not None and spec.pools[0].hosts == HostSelector({"site": "lon"}), problems
    [problem] = cross_problems(spec, hosts(), "fleet.yaml", "hosts.yaml")
    assert problem.json_path == "$.pools[0].hosts"
    assert "no host in hosts.yaml can serve pool owned: none has GPU 'RTX 4090' and labels site=lon" in problem.message
    fra, _ = check_spec_text(SPEC.replace("LABEL", "fra"), "fleet.yaml")
    assert fra is not None and cross_problems(fra, hosts(), "fleet.yaml", "hosts.yaml") == []
    # load_spec reads hosts.yaml beside the spec and refuses the pair when they disagree.
    (tmp_path / "fleet.yaml").write_text(SPEC.replace("LABEL", "lon"))
    (tmp_path / "hosts.yaml").write_text(HOSTS_YAML)
    with pytest.raises(Exception, match=r"no host in .*hosts.yaml can serve pool owned"):
        load_spec(tmp_path / "fleet.yaml")
    (tmp_path / "fleet.yaml").write_text(SPEC.replace("LABEL", "ams"))
    assert [h.name for h in load_spec(tmp_path / "fleet.yaml").hosts] == ["gpu-a", "gpu-b"]


def test_gpu_machine_ids_name_the_host() -> None:
    machine = gpu_machine_id("gpu-a", U[0])
    assert machine == f"gpu-a.{U[0]}" and len(machine) <= 64
    assert host_of_machine(machine) == "gpu-a" and host_of_machine("41001") is None
    assert machine_id_of_argument(f"gpu-a/{U[0]}") == machine and machine_id_of_argument("41001") == "41001"


# --- fit: pools pick hosts by GPU model and labels; rented pools never get an owned GPU ----------------------------


def test_pools_pick_hosts_by_labels_and_marketplace_statistics_do_not_apply(market: HostsMarketplace) -> None:
    query = offer_query(pool(site="fra"), ())
    offers = market.search_offers(query)
    fitting = [o.machine_id for o in offers if mismatch(o, query) is None]
    assert fitting == [gpu_machine_id("gpu-a", U[0]), gpu_machine_id("gpu-a", U[1])]
    ams = [o for o in offers if o.host_id == "gpu-b"]
    assert ams and all(mismatch(o, query) == "host labels site=ams lack site=fra" for o in ams)
    # reliability/verified/inet_down/CUDA are a market's statistics: an owned GPU is not measured by them
    assert mismatch(offers[0], replace(query, min_reliability=0.999, min_cuda=13.0, min_inet_down_mbps=10_000)) is None
    rented = OfferQuery(gpu_name="RTX 4090", verified_only=False)
    assert mismatch(offers[0], rented) == "a GPU of an owned host, the pool rents"


def test_combined_market_routes_owned_pools_to_hosts(market: HostsMarketplace,
                                                     engines: dict[str, FakeDockerEngine]) -> None:
    rented = FakeMarket([])
    combined = CombinedMarketplace(rented, market)
    out = SlotProvider(combined, SECRET, nonce=lambda: "abc123", clock=lambda: 1700.0).create(inputs(pool(site="ams")))
    assert out.host_id == "gpu-b" and out.contract_id.startswith("gpu-b.")
    assert combined.get_instance(out.contract_id) is not None and rented.queries == []
    with pytest.raises(NoOfferError, match="no offer fits pool rtx"):
        SlotProvider(combined, SECRET).create(inputs(replace(pool(), name="rtx", hosts=None), slot="rtx-0"))


# --- renting: one GPU, pinned, image by digest ----------------------------------------------------------------------


def test_rent_pins_one_gpu_with_the_env_and_labels_of_a_rented_instance(market: HostsMarketplace,
                                                                       engines: dict[str, FakeDockerEngine]) -> None:
    provider = SlotProvider(market, SECRET, nonce=lambda: "abc123", clock=lambda: 1700.0,
                            image_login="-u fleet-ci -p s3cret 127.0.0.1:5000")
    out = provider.create(inputs(pool(site="fra")))
    assert (out.machine_id, out.host_id, out.price_usd_per_hour) == (gpu_machine_id("gpu-a", U[0]), "gpu-a", 0.18)
    [run] = engines["gpu-a"].runs
    assert run.image == IMAGE and run.runtime == "nvidia" and run.network_mode == "host"
    assert run.env["NVIDIA_VISIBLE_DEVICES"] == U[0]
    assert run.env["FLEET_MACHINE_ID"] == out.machine_id and run.env["FLEET_HOST_ID"] == "gpu-a"
    assert run.env["FLEET_DAEMON_LISTEN"] == "127.0.0.1:9820"  # host network: each GPU's daemon its own port
    assert run.labels == {LABEL_FLEET: "gpu-fleet/main/owned-0-abc123", LABEL_GPU: U[0],
                          LABEL_MACHINE: out.machine_id, "io.gpu-fleet.host": "gpu-a"}
    assert run.mem_limit_bytes == 256 * 10**9
    assert engines["gpu-a"].pulled == [(IMAGE, {"username": "fleet-ci", "password": "s3cret",
                                                "serveraddress": "127.0.0.1:5000"})]
    # The next slot gets the sibling GPU: a busy GPU is not offered again.
    second = provider.create(inputs(pool(site="fra"), slot="owned-1"))
    assert second.machine_id == gpu_machine_id("gpu-a", U[1])
    assert engines["gpu-a"].runs[1].env["FLEET_DAEMON_LISTEN"] == "127.0.0.1:9821"


def test_counted_gpus_are_discovered_and_a_wrong_count_is_one_line(engines: dict[str, FakeDockerEngine]) -> None:
    market = HostsMarketplace(hosts(), lambda h: engines[h.name], notify=lambda _line: None)
    ids = [o.machine_id for o in market.search_offers(offer_query(pool(site="ams"), ())) if o.host_id == "gpu-b"]
    assert ids == sorted(gpu_machine_id("gpu-b", u) for u in U[2:6])
    engines["gpu-b"].gpus = U[2:5]
    market = HostsMarketplace(hosts(), lambda h: engines[h.name], notify=lambda _line: None)
    market.search_offers(offer_query(pool(site="ams"), ()))
    assert "nvidia-smi lists 3 GPU(s), hosts.yaml declares 4" in str(market.faults["gpu-b"])


# --- faults: one line naming host and cause; slot moved or held; nothing destroyed on a failed look -----------------


def test_an_unusable_host_is_skipped_with_one_line_and_the_slot_goes_elsewhere(
        market: HostsMarketplace, engines: dict[str, FakeDockerEngine]) -> None:
    engines["gpu-a"].fault = HostError("gpu-a", CAUSE_UNREACHABLE, "cannot connect to 10.0.0.5:22 (Connection "
                                       "refused)", temporary=True)
    engines["gpu-b"].runtimes = frozenset({"runc"})
    query = offer_query(pool(), ())
    assert market.search_offers(query) == []
    said = market.said  # type: ignore[attr-defined]
    assert said == ["host gpu-a: cannot connect to 10.0.0.5:22 (Connection refused) [unreachable]",
                    "host gpu-b: Docker has no NVIDIA runtime (runtimes: runc): install the NVIDIA container toolkit "
                    f"and run `nvidia-ctk runtime configure --runtime=docker` [{CAUSE_NO_NVIDIA_RUNTIME}]"]
    market.search_offers(query)
    assert len(said) == 2  # the same fault is said once, not on every look
    engines["gpu-a"].fault = None
    engines["gpu-a"].pull_error = "unauthorized: authentication required"
    engines["gpu-b"].runtimes = frozenset({"nvidia"})
    out = SlotProvider(market, SECRET, nonce=lambda: "abc123").create(inputs(pool()))
    assert out.host_id == "gpu-b"  # gpu-a's registry refused the pull: the slot moved to another host
    assert any("host gpu-a: cannot pull" in line and "[pull-refused]" in line for line in said)


def test_a_failed_look_is_unknown_never_gone_and_nothing_is_removed(market: HostsMarketplace,
                                                                    engines: dict[str, FakeDockerEngine]) -> None:
    out = SlotProvider(market, SECRET, nonce=lambda: "abc123").create(inputs(pool(site="fra")))
    engines["gpu-a"].fault = HostError("gpu-a", "ssh-auth-refused", "10.0.0.5:22 refused SSH authentication",
                                       temporary=False)
    seen = market.get_instance(out.contract_id)
    assert seen is not None and seen.status == "unknown" and "refused SSH authentication" in (seen.status_msg or "")
    assert market.list_instances() == []  # the sweep sees nothing on that host, so it removes nothing there
    with pytest.raises(HostError, match=r"host gpu-a: .*refused SSH"):
        market.destroy_instance(out.contract_id)
    engines["gpu-a"].fault = None
    assert engines["gpu-a"].removed == [] and market.get_instance(out.contract_id) is not None
    market.destroy_instance(out.contract_id)
    assert market.get_instance(out.contract_id) is None  # the engine answered: gone


def test_statuses_come_from_the_container(market: HostsMarketplace, engines: dict[str, FakeDockerEngine]) -> None:
    out = SlotProvider(market, SECRET, nonce=lambda: "abc123").create(inputs(pool(site="fra")))
    cid = out.contract_id.split(".", 1)[1]
    engines["gpu-a"].set_state(cid, "exited", exit_code=3)
    seen = market.get_instance(out.contract_id)
    assert seen is not None and (seen.status, seen.status_msg) == ("exited", "container exited with code 3")
    # an exited worker frees its GPU for the next offer
    assert gpu_machine_id("gpu-a", U[0]) in [o.machine_id for o in market.search_offers(offer_query(pool(), ()))]


def test_drained_and_banned_hosts_take_no_new_worker_and_banned_ones_lose_their_slots() -> None:
    a, b = hosts()
    drained, banned = replace(a, state="drain"), replace(b, state="banned")
    engines = {"gpu-a": FakeDockerEngine("gpu-a"), "gpu-b": FakeDockerEngine("gpu-b", gpus=U[2:6])}
    market = HostsMarketplace((drained, banned), lambda h: engines[h.name])
    assert market.search_offers(offer_query(pool(), ())) == []
    assert excluded_by_hosts((drained, banned), [gpu_machine_id("gpu-b", U[3]), gpu_machine_id("gpu-a", U[0])]) \
        == {gpu_machine_id("gpu-b", U[3])}
    spec, _ = check_spec_text(SPEC.replace("LABEL", "ams"), "fleet.yaml")
    assert spec is not None
    spec = replace(spec, hosts=(drained, banned))
    now = datetime(2026, 12, 6, tzinfo=UTC)
    observed = {s: ObservedSlot(slot=s, pool="owned", instance_id=f"{s}-abc123", machine_id=m, image_digest=DIGEST,
                                status="running", price_usd_per_hour=0.2, status_since=now.timestamp())
                for s, m in (("owned-0", gpu_machine_id("gpu-a", U[0])), ("owned-1", gpu_machine_id("gpu-b", U[2])))}
    actions = {a.slot: a for a in plan(spec, observed, RecordSet(), DIGEST, now).actions}
    assert actions["owned-0"].kind == "keep"  # drained: its worker stays
    assert isinstance(actions["owned-1"], Replace) and actions["owned-1"].reason == REASON_MACHINE_BAD
    assert "host gpu-b" in actions["owned-1"].detail


def test_the_request_env_secret_never_reaches_a_message(market: HostsMarketplace,
                                                        engines: dict[str, FakeDockerEngine]) -> None:
    engines["gpu-a"].start_error = "the container did not start: nvidia-container-cli: device error: unknown device"
    engines["gpu-b"].fault = HostError("gpu-b", CAUSE_UNREACHABLE, "down", temporary=True)
    request = InstanceRequest(image=IMAGE, disk_gb=100, label="gpu-fleet/main/owned-0-abc123",
                              env={"FLEET_TOKEN": "tok-SECRET-1234"}, image_login="-u u -p pw-SECRET x")
    with pytest.raises(Exception) as err:
        market.create_instance(gpu_machine_id("gpu-a", U[0]), request)
    assert "unknown device" in str(err.value)
    assert "SECRET" not in str(err.value) and not any("SECRET" in line for line in market.said)  # type: ignore[attr-defined]


# --- a host's story: several GPUs failing alike name the host ---------------------------------------------------------


def _failed(machine_id: str, at: str, signature: str | None, blame: str = "machine") -> MachineRecord:
    entry = BenchmarkEntry(instance_id=f"i-{machine_id[-3:]}-{at[-9:-7]}", at=at, verdict="benchmark-error",
                           blame=blame, marks_bad=blame == "machine", reason="benchmark-error", signature=signature)
    return MachineRecord(machine_id=machine_id, status="bad", host_id=machine_id.partition(".")[0],
                         benchmarks=(entry,))


def test_several_gpus_of_a_host_failing_alike_name_the_host_and_one_does_not() -> None:
    now = datetime(2026, 12, 6, 12, tzinfo=UTC)
    one = [_failed(gpu_machine_id("gpu-a", U[0]), "2026-12-06T10:00:00Z", "gpu-ecc"),
           MachineRecord(machine_id=gpu_machine_id("gpu-a", U[1]))]
    assert host_verdicts(one, now) == []
    story = host_story("gpu-a", one, now)
    assert story[0] == "host gpu-a: 2 GPU(s) on record" and "each card answers for itself" in story[-1]
    two = [*one, _failed(gpu_machine_id("gpu-a", U[2]), "2026-12-06T11:00:00Z", "gpu-ecc"),
           _failed(gpu_machine_id("gpu-b", U[3]), "2026-12-06T11:00:00Z", "gpu-ecc")]  # another host: not counted
    [verdict] = host_verdicts(two, now)
    assert (verdict.host, verdict.signature, len(verdict.gpus)) == ("gpu-a", "gpu-ecc", 2)
    assert "host gpu-a: 2 of its GPUs failed alike (gpu-ecc)" in host_story("gpu-a", two, now)[-1]
    # Stale failures, other signatures, image blame and entries without a signature are no evidence.
    old = [_failed(gpu_machine_id("gpu-a", U[0]), "2026-12-04T10:00:00Z", "gpu-ecc"),
           _failed(gpu_machine_id("gpu-a", U[2]), "2026-12-06T11:00:00Z", "gpu-ecc")]
    assert host_verdicts(old, now) == []
    assert host_verdicts([_failed(gpu_machine_id("gpu-a", U[0]), "2026-12-06T10:00:00Z", "x", "image"),
                          _failed(gpu_machine_id("gpu-a", U[2]), "2026-12-06T11:00:00Z", "x", "image")], now) == []
    assert host_verdicts([_failed(gpu_machine_id("gpu-a", U[0]), "2026-12-06T10:00:00Z", None),
                          _failed(gpu_machine_id("gpu-a", U[2]), "2026-12-06T11:00:00Z", None)], now) == []
    assert host_story("gpu-z", two, now) == []


def test_both_drivers_build_the_hosts_backend_from_plain_settings(tmp_path: Path) -> None:
    """`fleet apply` and the pickled Pulumi provider carry only plain settings: the inventory's path."""
    import pickle

    from reconciler import REPO_ROOT
    from reconciler.adapters.marketplace import build_marketplace
    from reconciler.adapters.pulumi_provider import SlotResourceProvider

    (tmp_path / "hosts.yaml").write_text(HOSTS_YAML)
    owned = build_marketplace({"kind": "hosts", "hosts_file": str(tmp_path / "hosts.yaml")}, {})
    assert isinstance(owned, HostsMarketplace) and list(owned.hosts) == ["gpu-a", "gpu-b"]
    local = {"kind": "local", "state_dir": str(tmp_path / "market"),
             "machines_file": str(REPO_ROOT / "reconciler" / "demo_assets" / "local-machines.yaml"),
             "hosts_file": str(tmp_path / "hosts.yaml")}
    both = build_marketplace(local, {})
    assert isinstance(both, CombinedMarketplace) and both.owned.claims(f"gpu-b.{U[2]}")
    assert not both.owned.claims("offer-41001") and not both.owned.claims("local-3")
    provider = pickle.loads(pickle.dumps(SlotResourceProvider(local)))  # noqa: S301 - our own object
    assert provider.backend["hosts_file"] == str(tmp_path / "hosts.yaml")
    (tmp_path / "hosts.yaml").write_text(HOSTS_YAML.replace("gpus: 4", "gpus: many"))
    with pytest.raises(Exception, match=r"hosts.yaml.*\$\.hosts\[1\]\.gpus"):
        build_marketplace({"kind": "hosts", "hosts_file": str(tmp_path / "hosts.yaml")}, {})
