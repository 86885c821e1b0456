"""GPU model knowledge used before any benchmark exists: known marketplace names and throughput priors.

Read by spec validation (unknown model -> warning, not error: marketplaces add models faster than we do)
and by offer ranking (prior proofs/hour for machines with no history of their own).
"""

from __future__ import annotations

#: Rough PoRep 32 GiB proofs/hour per GPU with ample host RAM (cuzk, 2026). Only a ranking prior: every
#: machine is benchmarked before it is trusted. Sources: published cuzk figures (RTX 5070 Ti ~38 s/proof)
#: scaled by relative CUDA throughput.
GPU_PRIOR_PROOFS_PER_HOUR: dict[str, float] = {
    "RTX 3090": 35.0,
    "RTX 3090 Ti": 38.0,
    "RTX 4070 Ti": 40.0,
    "RTX 4080": 50.0,
    "RTX 4090": 60.0,
    "RTX 5070 Ti": 90.0,
    "RTX 5080": 100.0,
    "RTX 5090": 130.0,
    "RTX A4000": 22.0,
    "RTX A5000": 30.0,
    "RTX A6000": 38.0,
    "RTX PRO 4000": 35.0,
    "RTX PRO 6000": 110.0,
    "L4": 18.0,
    "L40S": 60.0,
    "A100 PCIE": 55.0,
    "A100 SXM4": 60.0,
    "H100 PCIE": 90.0,
    "H100 SXM": 110.0,
}

KNOWN_GPU_MODELS = frozenset(GPU_PRIOR_PROOFS_PER_HOUR)
