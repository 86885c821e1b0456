"""Local marketplace: declared machines, real detached worker processes, state shared across instances."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.adapters.marketplace.local import (
    _CHILDREN,
    STATE_FILE,
    LocalMachine,
    LocalMachinesError,
    LocalMarketplace,
    _group_members,
    load_local_machines,
    parse_local_machines,
)
from reconciler.domain.marketplace import InstanceRequest, OfferQuery, PermanentMarketplaceError
from reconciler.domain.ranking import mismatch

MACHINES_YAML = """
machines:
  - machine_id: fast-1
    host_id: host-a
    gpu_name: RTX 4090
    price_usd_per_hour: 0.40
    reliability: 0.99
    env: {STANDIN_SECONDS_PER_PROOF: 0.5}
  - machine_id: 1234
    host_id: 77
    gpu_name: RTX 4090
    price_usd_per_hour: 0.30
    verified: false
    env: {STANDIN_FAIL_AFTER: 2, STANDIN_ERROR_LINE: "CUDA error: an illegal memory access"}
"""

QUERY = OfferQuery(gpu_name="RTX 4090", max_price_usd_per_hour=1.0, min_reliability=0.9, verified_only=False)


def wait_exit(market: LocalMarketplace, contract_id: str) -> int:
    """Block until the worker process of `contract_id` exits (a wait on the child, not a sleep)."""
    pid = json.loads((market.state_dir / STATE_FILE).read_text())["instances"][contract_id]["pid"]
    return _CHILDREN[pid].wait(timeout=60)


@pytest.fixture
def machines() -> list[LocalMachine]:
    return parse_local_machines(MACHINES_YAML, "machines.yaml")


@pytest.fixture
def market(tmp_path: Path, machines: list[LocalMachine]) -> Iterator[LocalMarketplace]:
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    m = LocalMarketplace(tmp_path / "state", machines, worker_command=sleeper)
    yield m
    for inst in m.list_instances():
        m.destroy_instance(inst.contract_id)


def request(label: str = "rtx4090-0-abc123", **env: str) -> InstanceRequest:
    return InstanceRequest(image="img", disk_gb=10, label=label, env={"FLEET_INSTANCE_ID": label, **env})


def test_loader_reads_types_and_env(machines: list[LocalMachine]) -> None:
    assert [m.machine_id for m in machines] == ["fast-1", "1234"]
    assert machines[1].host_id == "77" and machines[1].verified is False
    assert machines[0].env == {"STANDIN_SECONDS_PER_PROOF": "0.5"}
    assert machines[1].env["STANDIN_FAIL_AFTER"] == "2"


@pytest.mark.parametrize(("text", "expected"), [
    ("machines: [{host_id: h, gpu_name: X, price_usd_per_hour: 1}]", "$.machines[0]: 'machine_id' is a required"),
    ("machines: [{machine_id: a, host_id: h, gpu_name: X, price_usd_per_hour: -1}]",
     "$.machines[0].price_usd_per_hour: -1 is less than the minimum"),
    ("machines: [{machine_id: ../x, host_id: h, gpu_name: X, price_usd_per_hour: 1}]",
     "$.machines[0].machine_id: machine_id '../x' is not a safe id"),
    ("machines: [{machine_id: a, host_id: h, gpu_name: X, price_usd_per_hour: 1},"
     " {machine_id: a, host_id: h, gpu_name: X, price_usd_per_hour: 1}]", "$.machines[1].machine_id: duplicate 'a'"),
    ("machines: [{machine_id: a, host_id: h, gpu_name: X, price_usd_per_hour: 1, colour: red}]",
     "Additional properties are not allowed ('colour'"),
    ("machines: [", "not valid YAML"),
])
def test_loader_errors_name_file_and_field(text: str, expected: str) -> None:
    with pytest.raises(LocalMachinesError) as err:
        parse_local_machines(text, "demo/machines.yaml")
    assert str(err.value).startswith("demo/machines.yaml: ")
    assert expected in str(err.value)


def test_loader_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LocalMachinesError, match="file not found"):
        load_local_machines(tmp_path / "nope.yaml")


def test_search_prefilters_raw_fields_and_hides_rented_machines(market: LocalMarketplace) -> None:
    assert [o.machine_id for o in market.search_offers(QUERY)] == ["1234", "fast-1"]  # cheapest first
    excluded = OfferQuery(**{**QUERY.__dict__, "exclude_machine_ids": frozenset({"1234"})})
    assert [o.machine_id for o in market.search_offers(excluded)] == ["fast-1"]
    # Fit (here: verified hosts only) is the one rule's (domain/ranking.py), not the adapter's.
    verified = OfferQuery(**{**QUERY.__dict__, "verified_only": True})
    assert [o.machine_id for o in market.search_offers(verified) if mismatch(o, verified) is None] == ["fast-1"]
    market.create_instance("offer-fast-1", request())
    assert [o.machine_id for o in market.search_offers(QUERY)] == ["1234"]
    with pytest.raises(PermanentMarketplaceError, match="no longer available"):
        market.create_instance("offer-fast-1", request("other"))
    with pytest.raises(PermanentMarketplaceError, match="does not exist"):
        market.create_instance("offer-nope", request())


def test_instance_state_is_shared_and_destroy_is_idempotent(market: LocalMarketplace,
                                                            machines: list[LocalMachine]) -> None:
    cid = market.create_instance("offer-fast-1", request())
    other_run = LocalMarketplace(market.state_dir, machines)  # what a second `fleet apply` sees
    inst = other_run.get_instance(cid)
    assert inst is not None and inst.status == "running" and inst.label == "rtx4090-0-abc123"
    assert inst.machine_id == "fast-1" and inst.host_id == "host-a" and inst.price_usd_per_hour == 0.40
    assert [i.contract_id for i in other_run.list_instances()] == [cid]
    other_run.destroy_instance(cid)
    assert market.get_instance(cid) is None
    market.destroy_instance(cid)  # already gone: not an error
    assert "fast-1" in [o.machine_id for o in market.search_offers(QUERY)]


def test_worker_env_path_and_log(tmp_path: Path, machines: list[LocalMachine]) -> None:
    image = tmp_path / "worker-image"
    (image / "standin").mkdir(parents=True)
    (image / "standin" / "cuzk-bench").write_text("#!/bin/sh\necho \"stand-in rate=$STANDIN_SECONDS_PER_PROOF\"\n")
    (image / "standin" / "cuzk-bench").chmod(0o755)
    (image / "entrypoint.sh").write_text(
        'echo "id=$FLEET_INSTANCE_ID token=$FLEET_TOKEN"\n'
        'echo "home-set=${HOME:+yes} secret=${VASTAI_API_KEY:-unset}"\n'
        "cuzk-bench\nexit 3\n")
    market = LocalMarketplace(tmp_path / "state", machines)
    os.environ["VASTAI_API_KEY"] = "operator-secret"
    try:
        cid = market.create_instance("offer-fast-1", InstanceRequest(
            image=str(image), disk_gb=10, label="p-0-aaaaaa", env={"FLEET_INSTANCE_ID": "p-0-aaaaaa",
                                                                   "FLEET_TOKEN": "t0k"}))
    finally:
        del os.environ["VASTAI_API_KEY"]
    assert wait_exit(market, cid) == 3
    inst = market.get_instance(cid)
    assert inst is not None and inst.status == "exited" and inst.is_dead
    assert inst.status_msg == "worker exited with code 3"
    log = market.log_path(cid).read_text()
    assert "id=p-0-aaaaaa token=t0k" in log
    assert "home-set=yes secret=unset" in log  # the operator's environment does not leak into workers
    assert "stand-in rate=0.5" in log
    # an exited instance still holds its machine until destroyed, like a stopped vast.ai instance
    assert "fast-1" not in [o.machine_id for o in market.search_offers(QUERY)]
    market.destroy_instance(cid)


def test_dead_worker_seen_from_another_process_is_exited(tmp_path: Path, machines: list[LocalMachine]) -> None:
    market = LocalMarketplace(tmp_path / "state", machines, worker_command=[sys.executable, "-c", "pass"])
    cid = market.create_instance("offer-fast-1", request())
    wait_exit(market, cid)
    _CHILDREN.clear()  # forget we are the parent: judge from /proc only, as a later `fleet apply` would
    inst = LocalMarketplace(market.state_dir, machines).get_instance(cid)
    assert inst is not None and inst.status == "exited"
    market.destroy_instance(cid)


def test_destroy_kills_the_whole_process_group(tmp_path: Path, machines: list[LocalMachine]) -> None:
    spawner = [sys.executable, "-c",
               "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
               " print('spawned', flush=True); time.sleep(600)"]
    market = LocalMarketplace(tmp_path / "state", machines, worker_command=spawner)
    cid = market.create_instance("offer-fast-1", request())
    pid = json.loads((market.state_dir / STATE_FILE).read_text())["instances"][cid]["pid"]
    # wait (bounded by the child's own progress, not by a timer) until the grandchild exists
    log = market.log_path(cid)
    for _ in range(10_000):
        if len(_group_members(pid)) >= 2 and "spawned" in log.read_text():
            break
        _CHILDREN[pid].poll()
    assert len(_group_members(pid)) >= 2
    market.destroy_instance(cid)
    assert _group_members(pid) == []


def test_non_directory_image_without_command_is_permanent(tmp_path: Path, machines: list[LocalMachine]) -> None:
    market = LocalMarketplace(tmp_path / "state", machines)
    with pytest.raises(PermanentMarketplaceError, match="worker-image directory"):
        market.create_instance("offer-fast-1", request())
    assert market.list_instances() == []


def test_corrupt_state_is_not_overwritten(tmp_path: Path, machines: list[LocalMachine]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / STATE_FILE).write_text("{not json")
    market = LocalMarketplace(state, machines)
    with pytest.raises(Exception, match="unreadable"):
        market.list_instances()
    assert (state / STATE_FILE).read_text() == "{not json"
