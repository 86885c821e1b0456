"""A fleet for the live surfaces' tests: the seed incident recorded on a real git origin, the reconciler's clone,
every worker in a real controller store and a slot state with prices; plus serving an ASGI app on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import uvicorn

from reconciler.adapters.git import GitStore
from reconciler.adapters.record_files import (
    image_record_path,
    machine_record_path,
    render_image_record,
    render_machine_record,
)
from reconciler.adapters.slot_provider import SLOT_STATE_FILE, save_slot_state
from reconciler.domain.judging import decide
from reconciler.domain.records import RecordSet
from reconciler.domain.slots import SlotOutputs
from tests.browser_support import store_incident
from tests.gitrepos import git, make_origin
from tests.html_support import FIRST, NOW, RUNNING, SECOND, SLOW
from tests.scenarios import DIGEST, SPEC, SPEC_YAML

READ_TOKEN = "status-read-token-0123456789abcdef"
ADMIN_TOKEN = "status-admin-token-0123456789abcdef"
#: The benchmarking PRO 4000 costs $0.41/h (from the provisioner's slot state).
RUNNING_PRICE = 0.41


@dataclass(frozen=True)
class LiveFleet:
    origin: Path
    bot: Path
    db: Path
    state_dir: Path


def make_live_fleet(tmp_path: Path) -> LiveFleet:
    decided = decide(SPEC, [FIRST, SECOND, SLOW], RecordSet(), set(), DIGEST, NOW)
    files = {"fleet-spec/fleet.yaml": SPEC_YAML}
    for record in decided.machine_records.values():
        files[str(machine_record_path(Path("fleet-spec"), record.machine_id))] = render_machine_record(record)
    for image in decided.image_records.values():
        files[str(image_record_path(Path("fleet-spec"), image.image_digest))] = render_image_record(image)
    origin, _ = make_origin(tmp_path, files)
    bot = tmp_path / "bot"
    GitStore.clone(str(origin), bot).close()
    git(bot, "log", "-1")
    db = store_incident(tmp_path / "controller.db")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    slot = SlotOutputs(slot="rtx-pro-4000-0", pool_name="rtx-pro-4000", instance_id=RUNNING.instance_id,
                       contract_id="c-1", machine_id=str(RUNNING.machine_id), host_id="8080",
                       gpu_name="RTX PRO 4000", price_usd_per_hour=RUNNING_PRICE,
                       image="registry.local/w@" + DIGEST, image_digest=DIGEST, status="running")
    save_slot_state(state_dir / SLOT_STATE_FILE, {slot.slot: slot})
    # What `fleet apply`'s orphan sweep left: one orphan past its grace period, and the fleet's spend cap.
    (state_dir / "market.json").write_text(json.dumps({
        "version": 1, "at": "2026-12-02T21:59:00Z", "max_total_dph": 5.0, "slots_usd_per_hour": RUNNING_PRICE,
        "orphans_usd_per_hour": 0.33, "orphans": [{
            "contract_id": "7781234", "label": "gpu-fleet/rtx4090-3", "slot": "rtx4090-3", "kind": "orphan",
            "why": "no slot owns it (a killed apply)", "machine_id": "41009", "price_usd_per_hour": 0.33,
            "due": True}]}))
    return LiveFleet(origin, bot, db, state_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_asgi(app: Any) -> Iterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1; the socket listens before the thread starts, so clients can
    connect at once (their connections wait in the backlog)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def at_now() -> datetime:
    return NOW
