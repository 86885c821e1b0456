"""What a proving workload needs from a machine's host RAM, known before anything is rented.

Read by spec validation (a pool whose `min_host_ram_gb` cannot hold its own benchmark is refused at plan
time, naming the setting) and by offer ranking (an offer below the workload's need is never rented).
The worker enforces the same rule at run time: it sizes cuzk-daemon's budget from the container's limit
and stops the warm-up when the budget cannot hold the SRS (worker-image/warmup.sh).

Figures from curio at e0294b0f (extern/cuzk): cuzk loads the SRS (.params) into pinned host RAM
(cuzk-core srs_manager.rs:203-222), each proof in flight holds a per-partition working set
(cuzk-core memory.rs:36-54), the PCE build of the first proof needs a 14 GiB transient (memory.rs:57),
and the daemon keeps a 5 GiB safety margin (config.rs:89-91).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB_IN_GB = 1.073741824

#: Size of the circuit's SRS (.params file) in GiB. Window PoSt 57 GiB, Winning PoSt 184 MiB and SnapDeals
#: 33 GiB are curio's own comments (srs_manager.rs:86-90); curio does not state the PoRep 32 GiB file's
#: size: 44 GiB (~47 GB) is our estimate, also the stand-in's STANDIN_SRS_GIB default. Adjust when measured.
SRS_GIB: dict[str, float] = {"porep": 44.0, "window": 57.0, "winning": 0.2, "snap": 33.0}
#: Working set of one proof in flight (memory.rs:36 POREP_PARTITION_FULL_BYTES, :45, :49, :53).
WORKING_SET_GIB: dict[str, float] = {"porep": 14.0, "window": 14.0, "winning": 0.5, "snap": 9.0}
PCE_TRANSIENT_GIB = 14.0
SAFETY_MARGIN_GIB = 5.0


@dataclass(frozen=True)
class RamNeed:
    """Host RAM one machine needs for `proof_type` at `concurrency` proofs in flight."""

    proof_type: str
    concurrency: int
    srs_gib: float
    working_set_gib: float
    total_gib: float

    @property
    def total_gb(self) -> int:
        """In the marketplace's unit (GB, as vast.ai's cpu_ram), rounded up."""
        return math.ceil(self.total_gib * GIB_IN_GB)

    def explain(self) -> str:
        return (f"{self.proof_type} at -j {self.concurrency} needs {self.total_gib:g} GiB ({self.total_gb} GB) of host "
                f"RAM: SRS {self.srs_gib:g} GiB + {self.concurrency} x {self.working_set_gib:g} GiB per proof in "
                f"flight + {PCE_TRANSIENT_GIB:g} GiB PCE build + {SAFETY_MARGIN_GIB:g} GiB margin")


def ram_need(proof_type: str, concurrency: int) -> RamNeed:
    srs = SRS_GIB.get(proof_type, SRS_GIB["porep"])
    per_proof = WORKING_SET_GIB.get(proof_type, WORKING_SET_GIB["porep"])
    jobs = max(1, concurrency)
    total = srs + jobs * per_proof + PCE_TRANSIENT_GIB + SAFETY_MARGIN_GIB
    return RamNeed(proof_type, jobs, srs, per_proof, round(total, 1))


def ram_shortfall(min_host_ram_gb: float, proof_type: str, concurrency: int) -> str | None:
    """Why machines with `min_host_ram_gb` cannot run this benchmark, or None when they can."""
    need = ram_need(proof_type, concurrency)
    if min_host_ram_gb >= need.total_gb:
        return None
    return (f"machines with {min_host_ram_gb:g} GB of host RAM cannot run this pool's benchmark: {need.explain()}. "
            f"cuzk would block on its memory budget or be OOM-killed; raise min_host_ram_gb to at least "
            f"{need.total_gb} or lower benchmark.concurrency")
