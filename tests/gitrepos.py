"""Real git repositories in tmp dirs for tests: a bare "origin", a bot clone, human clones.

Uses the git CLI directly (not gitpython: only reconciler/adapters/git.py imports that) with a fixed human
identity and no global/system config, so tests behave the same on a fresh CI machine.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

HUMAN_NAME = "Ada Operator"
HUMAN_EMAIL = "ada@example.invalid"

_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": HUMAN_NAME,
    "GIT_AUTHOR_EMAIL": HUMAN_EMAIL,
    "GIT_COMMITTER_NAME": HUMAN_NAME,
    "GIT_COMMITTER_EMAIL": HUMAN_EMAIL,
    "GIT_TERMINAL_PROMPT": "0",
}


def git(cwd: Path, *args: str) -> str:
    """Run git in `cwd` as the test human; return stdout; raise with stderr on failure."""
    proc = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_ENV}, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout


def write_files(root: Path, files: Mapping[str, str | None]) -> None:
    """Write (or, for None, delete) repo-relative files."""
    for rel, text in files.items():
        path = root / rel
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")


def make_origin(tmp_path: Path, files: dict[str, str], *, name: str = "origin.git") -> tuple[Path, Path]:
    """A bare repo on branch main seeded with `files` in one commit; returns (bare_path, seed_clone)."""
    bare = tmp_path / name
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    seed = tmp_path / f"{name.removesuffix('.git')}-seed"
    git(tmp_path, "clone", "--quiet", str(bare), str(seed))
    git(seed, "checkout", "--quiet", "-B", "main")
    write_files(seed, files or {"README.md": "fleet\n"})
    git(seed, "add", "--all")
    git(seed, "commit", "--quiet", "-m", "seed")
    git(seed, "push", "--quiet", "origin", "main")
    return bare, seed


def clone(bare: Path, dest: Path) -> Path:
    git(dest.parent, "clone", "--quiet", "--branch", "main", str(bare), str(dest))
    return dest


def human_commit(clone_dir: Path, files: Mapping[str, str | None], message: str = "human edit", *,
                 push: bool = True) -> str:
    """Pull, apply `files` (None deletes), commit as the human, optionally push; returns the new sha."""
    git(clone_dir, "pull", "--quiet", "--ff-only", "origin", "main")
    write_files(clone_dir, files)
    git(clone_dir, "add", "--all")
    git(clone_dir, "commit", "--quiet", "-m", message)
    if push:
        git(clone_dir, "push", "--quiet", "origin", "main")
    return git(clone_dir, "rev-parse", "HEAD").strip()


def origin_file(bare: Path, path: str, ref: str = "main") -> str | None:
    """Text of `path` on the origin's branch, or None if it is absent."""
    proc = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=bare, env={**os.environ, **_ENV},
                          capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


def origin_log(bare: Path, fmt: str = "%an|%s", ref: str = "main") -> list[str]:
    return git(bare, "log", f"--format={fmt}", ref).splitlines()


def install_rejecting_hook(bare: Path, message: str = "branch frozen for maintenance") -> Path:
    """A pre-receive hook that refuses every push (remove the returned file to lift it)."""
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    hook.chmod(0o755)
    return hook
