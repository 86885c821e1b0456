"""`fleet --help` and `fleet validate` stay light: they import no Pulumi, gitpython or HTTP stack (the CLI
imported all of them on every start, ~0.5 s). Checked in a fresh interpreter, as a user runs it."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import REPO_ROOT
from reconciler.cli import COMMANDS

HEAVY = ("pulumi", "pulumi_docker", "git", "httpx", "uvicorn", "starlette", "jinja2", "prometheus_client")

_PROBE = """
import json, sys
from reconciler.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})
print(json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""


def _run(*args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=set(HEAVY)), *args], capture_output=True,
                          text=True, check=False, cwd=REPO_ROOT, timeout=120)
    result: dict[str, object] = json.loads(proc.stderr.strip().splitlines()[-1])
    return result


def test_fleet_help_imports_no_command_module_and_nothing_heavy() -> None:
    result = _run("--help")
    assert result == {"code": 0, "heavy": []}


def test_fleet_validate_imports_nothing_heavy(tmp_path: Path) -> None:
    spec = REPO_ROOT / "fleet-spec" / "fleet.yaml"
    result = _run("validate", str(spec))
    assert result["heavy"] == []
    assert result["code"] in (0, 1)


@pytest.mark.parametrize("args", [["records", "--spec-dir", "fleet-spec"], ["plan", "--spec", "fleet-spec/fleet.yaml"],
                                  ["status", "--spec-dir", "fleet-spec"]])
def test_read_only_commands_import_no_git_or_http_stack(args: list[str]) -> None:
    result = _run(*args)
    assert result["heavy"] == []
    assert result["code"] in (0, 1)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_static_help_of_each_command_is_what_its_module_registers(name: str) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(f"reconciler.cli.{name}").register(sub)
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert helps[name] == COMMANDS[name]
