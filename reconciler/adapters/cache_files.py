"""Where the rebuildable caches of a spec directory live: the record index and the validated-spec cache.

Place in the flow: `record_index` and `spec_files` ask here for their file. Inside a git checkout a cache
lives in the checkout's own git directory (`<git dir>/fleet/`, a worktree's own), never in the work tree, so
it is never committed and goes with the clone; a spec directory outside git gets
`<cache_home>/gpu-fleet/<name>-<hash of the directory><suffix>` (cache_home: $XDG_CACHE_HOME, read by the
settings adapter, or ~/.cache). Caches are never the source of truth: delete them at any time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from reconciler.adapters.settings import settings


def cache_file(spec_dir: Path, name: str, suffix: str, cache_home: Path | None = None) -> Path:
    """`<git dir>/fleet/<name><suffix>` of the checkout holding `spec_dir`, else the per-directory file under
    the cache home (see the module docstring)."""
    start = spec_dir.resolve()
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        if dot_git.is_dir():
            return dot_git / "fleet" / f"{name}{suffix}"
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
            if text.startswith("gitdir:"):
                git_dir = Path(text.removeprefix("gitdir:").strip())
                return (folder / git_dir if not git_dir.is_absolute() else git_dir) / "fleet" / f"{name}{suffix}"
    base = cache_home or settings().cache_home or Path.home() / ".cache"
    tag = hashlib.sha256(str(start).encode()).hexdigest()[:16]
    return base / "gpu-fleet" / f"{name}-{tag}{suffix}"
