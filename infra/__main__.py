"""Pulumi entry point: stack config -> components -> exports (see program.py)."""

import sys
from pathlib import Path

# Pulumi runs this directory as a script; make `infra.*` importable as a package from the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.program import main

main()
