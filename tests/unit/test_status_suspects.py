"""A pool's state is about what it runs (issue 25 item 4): an image suspect no pool runs any more (the demo's
v2 after v3 rolled out everywhere) is listed as history until cleared, not shown as any pool's state; while a
pool's desired image or an alive instance runs it, it is the pool's state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import ImageSuspectRecord, RecordSet
from reconciler.domain.status import status_view
from reconciler.render.text import render_text
from tests.scenarios import SPEC

NOW = datetime(2026, 12, 2, 22, 0, tzinfo=UTC)
V2 = "sha256:" + "b2" * 32
V3 = "sha256:" + "c3" * 32


def _records(*, status: str = "suspect") -> RecordSet:
    suspect = ImageSuspectRecord(image_digest=V2, signature="daemon-connection-refused", status=status,
                                 machines=("40213", "51877"), tripped_at="2026-12-02T20:00:00Z",
                                 pools=("rtx-pro-4000", "rtx4090"), reason="3 machines, same signature")
    return RecordSet(images={V2: suspect})


def _running(digest: str, pool: str = "rtx-pro-4000", n: int = 1) -> list[InstanceReport]:
    return [InstanceReport(instance_id=f"{pool}-{digest[7:9]}-{k}", registered_at=NOW - timedelta(minutes=5),
                           pool=pool, machine_id=str(50_000 + k), image_digest=digest) for k in range(n)]


def test_a_suspect_no_pool_runs_is_history_not_a_pool_state() -> None:
    view = status_view(SPEC, _records(), _running(V3) + _running(V3, "rtx4090"), NOW, desired_image_digest=V3)
    assert [p.state for p in view.pools] == ["ok", "ok"]
    (suspect,) = view.suspects
    assert suspect.in_use_by == ()
    text = render_text(view)
    assert "image suspects no pool runs any more (history" in text and V2[:19] in text
    assert "image suspects (circuit breaker):" not in text


def test_a_suspect_a_pool_still_runs_is_that_pools_state() -> None:
    # v3 is desired, but one rtx-pro-4000 instance still runs v2 (not replaced yet): that pool only.
    view = status_view(SPEC, _records(), _running(V2) + _running(V3, "rtx4090"), NOW, desired_image_digest=V3)
    states = {p.name: p.state for p in view.pools}
    assert states["rtx-pro-4000"].startswith(f"image suspect: {V2[:19]}") and states["rtx4090"] == "ok"
    assert view.suspects[0].in_use_by == ("rtx-pro-4000",)
    assert "image suspects (circuit breaker):" in render_text(view)


def test_the_desired_suspect_image_pauses_its_pools() -> None:
    view = status_view(SPEC, _records(), [], NOW, desired_image_digest=V2)
    assert all(p.state.startswith(f"paused: image {V2[:19]} suspect") for p in view.pools)
    assert view.suspects[0].in_use_by == ("rtx-pro-4000", "rtx4090")


def test_a_cleared_suspect_is_not_listed() -> None:
    view = status_view(SPEC, _records(status="cleared"), _running(V2), NOW, desired_image_digest=V3)
    assert view.suspects == () and [p.state for p in view.pools] == ["ok", "ok"]
