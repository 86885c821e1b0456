"""GPU proving fleet manager: spec in git -> Pulumi provisions slots -> workers benchmark -> reconciler judges."""

from pathlib import Path

__version__ = "0.1.0"

#: Repository root (the package is installed editable from it; schemas live under fleet-spec/schema).
REPO_ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = REPO_ROOT / "fleet-spec" / "schema"
