"""Plan-time refusal of pools whose machines cannot hold their own benchmark (issue 13): the spec names the
setting to change, ranking never offers such a machine, and the slot passes the memory settings on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.adapters.spec_files import check_spec_text, load_spec
from reconciler.cli import main
from reconciler.domain.marketplace import Offer
from reconciler.domain.ranking import mismatch, offer_query
from reconciler.domain.spec import BenchmarkSettings, SpecError
from reconciler.domain.workload import ram_need, ram_shortfall

SPEC = """\
version: 1
image:
  repository: ghcr.io/acme/cuzk-worker
controller:
  url: https://fleet.example.com
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: 2
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.6
    min_host_ram_gb: {ram}
    benchmark:
      proofs: 10
      concurrency: {jobs}
"""


def test_the_need_adds_srs_working_sets_pce_and_margin() -> None:
    need = ram_need("porep", 2)
    assert need.total_gib == 44 + 2 * 14 + 14 + 5
    assert need.total_gb == 98  # 91 GiB in the marketplace's GB, rounded up
    assert ram_need("porep", 4).total_gb > need.total_gb > ram_need("porep", 1).total_gb
    assert ram_need("winning", 1).total_gib < ram_need("porep", 1).total_gib < ram_need("window", 1).total_gib


def test_a_pool_with_too_little_ram_is_refused_naming_the_setting(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(SPEC.format(ram=64, jobs=2))
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    [problem] = [p for p in raised.value.problems if p.severity == "error"]
    assert problem.json_path == "$.pools[0].min_host_ram_gb" and problem.line == 12
    assert "got 64" in problem.message and "needs 91 GiB (98 GB)" in problem.message
    assert "raise min_host_ram_gb to at least 98 or lower benchmark.concurrency" in problem.message

    # `fleet plan` refuses it at plan time with the same line, before anything is rented.
    assert main(["plan", "--spec", str(path)]) != 0
    out = capsys.readouterr()
    assert "$.pools[0].min_host_ram_gb" in out.out + out.err and "needs 91 GiB" in out.out + out.err


def test_more_jobs_need_more_ram() -> None:
    assert check_spec_text(SPEC.format(ram=128, jobs=2))[0] is not None
    spec, problems = check_spec_text(SPEC.format(ram=128, jobs=8))
    assert spec is None
    assert [p.json_path for p in problems if p.severity == "error"] == ["$.pools[0].min_host_ram_gb"]
    assert ram_shortfall(128, "porep", 8) is not None and ram_shortfall(256, "porep", 8) is None


def test_an_explicit_budget_above_the_pools_ram_is_refused() -> None:
    text = SPEC.format(ram=128, jobs=2) + "      memory_budget_gib: 200\n"
    _, problems = check_spec_text(text)
    assert [p.json_path for p in problems if p.severity == "error"] == ["$.pools[0].benchmark.memory_budget_gib"]


def test_ranking_never_offers_a_machine_below_the_workloads_need() -> None:
    spec, _ = check_spec_text(SPEC.format(ram=98, jobs=2))
    assert spec is not None
    pool = replace(spec.pools[0], min_host_ram_gb=16)  # as if validation had been bypassed
    query = offer_query(pool, [])
    assert query.min_cpu_ram_gb == 98
    small = Offer(offer_id="1", machine_id="7", host_id="8", gpu_name="RTX 4090", num_gpus=1,
                  price_usd_per_hour=0.3, reliability=0.99, inet_down_mbps=900, disk_gb=500, cpu_ram_gb=64,
                  cuda_max_good=12.8)
    assert "host RAM 64" in (mismatch(small, query) or "")
    assert mismatch(replace(small, cpu_ram_gb=128), query) is None


def test_the_slot_passes_memory_and_c1_settings_to_the_worker() -> None:
    bench = BenchmarkSettings(memory_budget_gib=100, miner_id=1234, sector_num=7)
    assert (bench.memory_budget_gib, bench.miner_id, bench.sector_num) == (100, 1234, 7)
    spec, _ = check_spec_text(SPEC.format(ram=128, jobs=2) + "      memory_budget_gib: 100\n      miner_id: 1234\n")
    assert spec is not None and spec.pools[0].benchmark.memory_budget_gib == 100
    assert spec.pools[0].benchmark.miner_id == 1234 and spec.pools[0].benchmark.sector_num is None
