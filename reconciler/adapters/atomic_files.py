"""Writing a local file so that a crash or a full disk never leaves it half-written.

Place in the flow: a base every adapter that writes local files may use (records, the git adapter's staging,
slot state, the local marketplace, status pages); it imports nothing of the package, so adapters that use it
stay independent of each other.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: Path, text: str, *, fsync: bool = True) -> None:
    """Write via a temp file + fsync + rename: a crash or a full disk never leaves a partial file. `fsync=False`
    for a file whose copy of record is elsewhere (a git work tree: git holds the content once committed, and a
    sync rewrites the tree): readers still never see a partial file, and the write costs no disk flush."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
