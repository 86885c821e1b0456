"""Which replica leads, as data and as the surfaces show it (issue 24 item 2): the words, the trailer, and the
line `fleet status` and the page print from a replica's last pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reconciler.domain.leadership import LEADER_EPOCH_TRAILER, Leadership, describe, leader_trailer
from reconciler.domain.status import FleetStatus
from reconciler.flows.judge import PassResult
from reconciler.render.html import render_html
from reconciler.render.text import render_text
from tests.html_support import parse, text_of

SINCE = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
LEASE = Leadership(holder="ctl-b:8080~a1b2c3", epoch=7, since=SINCE, expires_at=SINCE + timedelta(seconds=15))


def test_the_leader_is_described_the_same_for_its_whole_term() -> None:
    early, late = SINCE + timedelta(seconds=1), SINCE + timedelta(seconds=14)
    assert describe(LEASE, "ctl-a:8080~ffffff", early) == describe(LEASE, "ctl-a:8080~ffffff", late) == \
        "replica ctl-b:8080~a1b2c3 leads (epoch 7) since 2026-12-02T18:00:00Z"
    assert describe(LEASE, LEASE.holder, early) == "this replica leads (epoch 7) since 2026-12-02T18:00:00Z"
    assert describe(LEASE, "x", SINCE + timedelta(seconds=15)) == (
        "the lease of replica ctl-b:8080~a1b2c3 (epoch 7) expired at 2026-12-02T18:00:15Z; "
        "the next replica to renew takes over")
    assert describe(None, "x", SINCE) == "no replica holds the lease yet"


def test_the_epoch_trailer_is_there_only_when_replicas_share_a_store() -> None:
    assert leader_trailer(7) == ((LEADER_EPOCH_TRAILER, "7"),)
    assert leader_trailer(None) == ()
    doc = LEASE.to_json(me=LEASE.holder, now=SINCE)
    assert doc == {"holder": LEASE.holder, "epoch": 7, "since": "2026-12-02T18:00:00Z",
                   "expires_at": "2026-12-02T18:00:15Z", "expired": False, "this_replica": True}


def test_a_standby_pass_is_ready_and_says_who_leads() -> None:
    result = PassResult(at=SINCE, standby=describe(LEASE, "me", SINCE))
    assert result.ok and result.headline() == f"standby: replica {LEASE.holder} leads (epoch 7) since " \
                                              "2026-12-02T18:00:00Z"
    condition = result.condition()
    assert (condition.type, condition.reason) == ("Ready", "Standby")
    assert result.to_json()["standby"] == result.standby


def test_status_text_and_page_show_the_leader_from_the_last_pass() -> None:
    summary = describe(LEASE, "ctl-a:8080~ffffff", SINCE)
    last = {"at": "2026-12-02T18:00:05Z", "headline": f"standby: {summary}",
            "leadership": {"replica": "ctl-a:8080~ffffff", "leading": False, "summary": summary,
                           "at": "2026-12-02T18:00:05Z"}}
    view = FleetStatus(at="2026-12-02T18:00:06Z", pools=(), instances=(), suspects=(), last_pass=last)
    assert f"leader: {summary} (as of 2026-12-02T18:00:05Z)" in render_text(view).splitlines()
    assert text_of(parse(render_html(view)).find(id="leader")[0]) == f"{summary} (as of 2026-12-02T18:00:05Z)"
    plain = FleetStatus(at="2026-12-02T18:00:06Z", pools=(), instances=(), suspects=(),
                        last_pass={"at": "2026-12-02T18:00:05Z", "headline": "nothing new; 0 pending"})
    assert "leader:" not in render_text(plain) and not parse(render_html(plain)).find(id="leader")
