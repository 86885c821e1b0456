"""Params mirror: serve a directory of proving parameters with the manifest workers verify against.

Workers fetch `<FLEET_PARAMS_BASE_URL>/manifest.txt` (lines `<blake2b-512 hex>  <size bytes>  <name>`, the
format of `b2sum` plus a size column) and then each file, resuming and checking sums
(worker-image/fetch-params.sh). Operators who keep a mirror next to their fleet generate the manifest with
`write_manifest`; `fleet demo` serves its small stand-in params through `ParamsMirrorServer`.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.txt"
_CHUNK = 1 << 20


def blake2b_file(path: Path) -> str:
    digest = hashlib.blake2b()  # 512-bit, the same as `b2sum`
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path) -> Path:
    """(Re)write `manifest.txt` for every regular file in `directory` (not recursive, names sorted)."""
    lines = []
    for path in sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST_NAME):
        if any(c.isspace() for c in path.name):
            raise ValueError(f"{path}: params file names must not contain whitespace (the manifest is "
                             "space-separated)")
        lines.append(f"{blake2b_file(path)}  {path.stat().st_size}  {path.name}\n")
    manifest = directory / MANIFEST_NAME
    manifest.write_text("".join(lines), encoding="utf-8")
    return manifest


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class ParamsMirrorServer:
    """Static HTTP server over one directory (Range requests are not needed: workers re-fetch small files,
    and large production mirrors sit behind a real web server)."""

    def __init__(self, directory: Path, host: str = "127.0.0.1", port: int = 0):
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ParamsMirrorServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="params-mirror", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
