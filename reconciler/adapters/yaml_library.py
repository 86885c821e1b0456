"""PyYAML with libyaml's safe loader and dumper: a base every adapter that reads or writes YAML uses (the spec,
capacity.yaml, the machine records).

libyaml parses a 40-pool spec in ~13 ms where PyYAML's pure-Python loader needs ~70 ms, and the records' codec
depends on it at fleet size. A PyYAML built without libyaml gets the pure-Python classes: the same documents,
slower. PyYAML is imported on first use: a command answered from the record index reads no YAML.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import yaml


@cache
def yaml_library() -> tuple[ModuleType, type[yaml.SafeLoader], type[yaml.SafeDumper]]:
    """(the yaml module, its safe loader class, its safe dumper class): libyaml's where PyYAML has them."""
    import yaml

    return yaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader), getattr(yaml, "CSafeDumper", yaml.SafeDumper)
