"""The layered layout keeps what existed working: old pickled Pulumi providers, and the layer contracts."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import dill  # Pulumi's own serializer for dynamic providers (a dependency of the pulumi SDK)

from reconciler.adapters.pulumi_provider import SlotResourceProvider

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pulumi"
REPO = Path(__file__).resolve().parents[2]


def test_a_provider_pickled_before_the_layout_move_still_loads() -> None:
    # Written by pulumi 3.272's serialize_provider from the flat layout (commit 27e13a4), exactly what a stack's
    # state holds as `__provider`: the provider host dill.loads it before every operation.
    blob = base64.b64decode((FIXTURES / "provider-before-layout.b64").read_text())
    assert b"reconciler.provider" in blob
    provider = dill.loads(blob)  # noqa: S301 - our own fixture, loaded as the provider host does
    assert isinstance(provider, SlotResourceProvider)
    assert provider.backend["kind"] == "local" and provider.backend["machines_file"] == "m.yaml"


def test_lint_imports_keeps_every_layer_contract() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(exe)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
