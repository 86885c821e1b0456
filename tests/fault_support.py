"""Shared pieces of the fault and secrets tests: a vast.ai spec, a pinned image, the controller secret, a
stepping clock, a bot clone of an origin and a register document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.flows.provision import Image
from tests.gitrepos import git
from tests.scenarios import DIGEST

SECRET = b"fault-test-controller-secret-0123"


# --- helpers shared with test_secrets.py ------------------------------------------------------------------




def register_doc(instance_id: str, machine_id: str, pool: str = "rtx-pro-4000") -> dict[str, Any]:
    return {"protocol": 1, "instance_id": instance_id, "at": "2026-12-02T18:00:00Z", "pool": pool,
            "slot": f"{pool}-0", "machine_id": machine_id, "host_id": "7781", "contract_id": "9001",
            "gpu_name": "RTX PRO 4000", "image_digest": DIGEST, "image_version": "v1"}


def bot_clone(origin: Path, workdir: Path) -> Path:
    git(workdir.parent, "clone", "--quiet", str(origin), str(workdir))
    return workdir


# --- marketplace faults during an apply pass ----------------------------------------------------------------

VAST_SPEC = """\
version: 1
image: {repository: registry.example/worker}
controller: {url: http://127.0.0.1:9}
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: 2
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.60
    min_reliability: 0.95
    min_inet_down_mbps: 500
"""
IMAGE = Image("registry.example/worker@sha256:" + "e" * 64, "sha256:" + "e" * 64)
