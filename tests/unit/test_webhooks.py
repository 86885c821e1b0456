"""Webhook notifier on a fake poster and an injected clock: once per event, retries with backoff, permanent
refusals dropped, a full queue never blocks, secrets and the URL never leave in logs or payloads."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest

from reconciler.adapters.spec_files import check_spec_text
from reconciler.adapters.webhooks import (
    WebhookConfigError,
    WebhookNotifier,
    WebhookTarget,
    payload,
    targets_from_env,
)
from reconciler.cli.surfaces import webhook_targets
from reconciler.domain.events import (
    BREAKER_TRIP,
    VERDICT,
    FleetEvent,
    breaker_event,
    orphan_destroyed_event,
    spend_cap_event,
)
from tests.scenarios import SPEC_YAML

AT = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)
SLACK_URL = "https://hooks.slack.example/services/T000/B000/XXXXSECRETXXXX"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakePoster:
    def __init__(self, answers: list[int | Exception] | None = None) -> None:
        self.answers = list(answers or [])
        self.calls: list[tuple[str, dict, Mapping[str, str]]] = []

    def __call__(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        self.calls.append((url, json.loads(body), dict(headers)))
        answer = self.answers.pop(0) if self.answers else 200
        if isinstance(answer, Exception):
            raise answer
        return answer


def event(key: str = "instance:i-1", kind: str = VERDICT) -> FleetEvent:
    return FleetEvent(kind, key, "2026-12-03T07:00:00Z", "benchmark-error exit 1: boom (blame: image)", "warning",
                      {"machine_id": "40213"})


def notifier(poster: FakePoster, clock: Clock, **kw: object) -> WebhookNotifier:
    targets = [WebhookTarget("ops", "http://127.0.0.1:9/hook", "generic")]
    return WebhookNotifier(targets, poster=poster, clock=clock, rng=random.Random(1), **kw)  # type: ignore[arg-type]


def test_each_event_is_delivered_once_with_a_stable_idempotency_key() -> None:
    poster, clock = FakePoster(), Clock()
    n = notifier(poster, clock)
    assert n.notify(event()) and n.notify(event()) and n.notify(event("instance:i-2"))
    assert n.deliver_due() == 2
    assert n.deliver_due() == 0 and n.pending() == 0
    keys = [c[2]["Idempotency-Key"] for c in poster.calls]
    assert len(keys) == 2 and len(set(keys)) == 2
    assert poster.calls[0][1]["idempotency_key"] == keys[0] == event().idempotency_key
    assert n.stats.skipped_duplicate == 1


def test_a_receiver_that_is_down_gets_the_event_when_it_is_back_with_growing_backoff() -> None:
    poster = FakePoster([ConnectionRefusedError("[Errno 111] Connection refused"), 503, 429, 200])
    clock = Clock()
    n = notifier(poster, clock, backoff_s=2.0, max_backoff_s=60.0)
    n.notify(event())
    delays = []
    for _ in range(3):
        assert n.deliver_due() == 0
        due = n.next_due()
        assert due is not None
        delays.append(due - clock.t)
        assert n.deliver_due() == 0  # not due yet: nothing is attempted early
        clock.t = due
    assert n.deliver_due() == 1
    assert len(poster.calls) == 4 and n.pending() == 0
    # Exponential with jitter in [0.5, 1] x 2, 4, 8 s.
    assert 1.0 <= delays[0] <= 2.0 and 2.0 <= delays[1] <= 4.0 and 4.0 <= delays[2] <= 8.0


def test_a_permanent_refusal_is_dropped_and_a_dead_receiver_is_given_up_on() -> None:
    poster, clock = FakePoster([400]), Clock()
    n = notifier(poster, clock)
    n.notify(event())
    n.deliver_due()
    assert n.pending() == 0 and n.stats.failed == 1 and len(poster.calls) == 1

    poster2 = FakePoster([OSError("down")] * 100)
    n2 = notifier(poster2, clock, backoff_s=10, max_backoff_s=100, give_up_after_s=1000)
    n2.notify(event())
    while (due := n2.next_due()) is not None:
        clock.t = due
        n2.deliver_due()
    assert n2.stats.failed == 1 and 5 <= len(poster2.calls) <= 25


def test_notify_never_blocks_a_full_queue_drops_and_counts() -> None:
    n = notifier(FakePoster(), Clock(), max_queue=2)
    assert n.notify(event("a")) and n.notify(event("b"))
    assert not n.notify(event("c"))
    assert n.stats.dropped_full == 1


def test_the_url_is_never_logged_and_texts_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    poster = FakePoster([ConnectionRefusedError(f"cannot connect to {SLACK_URL}"), 200])
    clock = Clock()
    n = WebhookNotifier([WebhookTarget("slack", SLACK_URL, "slack")], poster=poster, clock=clock,
                        rng=random.Random(1))
    caplog.set_level(logging.DEBUG)
    secret_event = orphan_destroyed_event("77", AT, label="x", reason="onstart had API_KEY=abcdef123456")
    n.notify(secret_event)
    n.deliver_due()
    clock.t = n.next_due() or clock.t
    n.deliver_due()
    assert SLACK_URL not in caplog.text and "XXXXSECRETXXXX" not in caplog.text and "hooks.slack" not in caplog.text
    assert "abcdef123456" not in json.dumps(poster.calls[-1][1])
    assert "[REDACTED]" in poster.calls[-1][1]["text"]
    assert "XXXXSECRET" not in repr(n.targets[0])


def test_slack_payload_escapes_control_characters() -> None:
    doc = payload(FleetEvent(VERDICT, "k", "2026-12-03T07:00:00Z", "a <b> & c", "info", {}), "slack")
    assert doc["text"] == "[gpu-fleet] a <b> & c"  # the plain fallback text
    assert "a &lt;b&gt; &amp; c" in doc["blocks"][0]["text"]["text"]


def test_events_carry_stable_keys() -> None:
    assert spend_cap_event(12.5, 10.0, AT, since="2026-12-03T06:00:00Z").key == "spend-cap:2026-12-03T06:00:00Z"

    class Record:
        image_digest = "sha256:" + "ab" * 32
        signature = "daemon-connection-refused"
        pools = ("rtx4090",)
        machines = ("1", "2")
        tripped_at = "2026-12-03T06:59:00Z"
        reason = "same failure on 2 machines"

    trip = breaker_event(Record(), AT)
    assert trip.kind == BREAKER_TRIP and trip.key == breaker_event(Record(), AT).key
    assert "no machine recorded bad" in trip.title and trip.severity == "critical"


def test_targets_from_the_environment() -> None:
    env = {"FLEET_WEBHOOK_URL": "https://hooks.slack.com/services/A/B/C", "FLEET_WEBHOOK_PAGER_URL": "http://h/x",
           "FLEET_WEBHOOK_PAGER_EVENTS": "breaker-trip,spend-cap", "HOME": "/root"}
    default, pager = sorted(targets_from_env(env), key=lambda t: t.name)
    assert (default.name, default.format) == ("default", "slack")
    assert (pager.name, pager.format, pager.kinds) == ("pager", "generic", frozenset({"breaker-trip", "spend-cap"}))
    with pytest.raises(WebhookConfigError, match="FLEET_WEBHOOK_X_URL: webhook x: the URL is not") as info:
        targets_from_env({"FLEET_WEBHOOK_X_URL": "ftp://secret-value"})
    assert "secret-value" not in str(info.value)
    with pytest.raises(WebhookConfigError, match="unknown event kind"):
        targets_from_env({"FLEET_WEBHOOK_URL": "http://h/x", "FLEET_WEBHOOK_EVENTS": "verdict,typo"})


SPEC_WITH_HOOKS = SPEC_YAML + """\
notifications:
  webhooks:
    - {name: ops, url_env: OPS_SLACK_WEBHOOK, format: slack, events: [breaker-trip, spend-cap]}
    - {name: audit, url_env: AUDIT_HOOK_URL}
"""


def test_webhooks_named_in_the_spec_take_their_url_from_the_environment() -> None:
    spec, problems = check_spec_text(SPEC_WITH_HOOKS, "fleet.yaml")
    assert spec is not None and not [p for p in problems if p.severity == "error"], problems
    targets, notes = webhook_targets(spec.notifications, {"OPS_SLACK_WEBHOOK": SLACK_URL})
    (ops,) = targets
    assert (ops.name, ops.format, ops.kinds, ops.url) == ("ops", "slack", frozenset({"breaker-trip", "spend-cap"}),
                                                          SLACK_URL)
    assert notes == ["webhook audit (spec): $AUDIT_HOOK_URL is not set; it stays off"]


def test_the_spec_refuses_a_url_in_place_of_the_variable_and_duplicate_names() -> None:
    leaked = SPEC_YAML + f"notifications:\n  webhooks:\n    - {{name: ops, url_env: '{SLACK_URL}'}}\n"
    spec, problems = check_spec_text(leaked, "fleet.yaml")
    assert spec is None and any("url_env" in p.json_path for p in problems), problems
    twice = SPEC_YAML + ("notifications:\n  webhooks:\n    - {name: ops, url_env: A_URL}\n"
                         "    - {name: ops, url_env: B_URL}\n")
    spec, problems = check_spec_text(twice, "fleet.yaml")
    assert spec is None and any("named twice" in p.message for p in problems), problems


def test_a_one_shot_command_flushes_with_retries_until_its_deadline() -> None:
    clock = Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.t += seconds

    poster = FakePoster([OSError("down"), 503, 200])
    n = notifier(poster, clock, backoff_s=1.0)
    n.notify(event())
    assert n.flush(60, sleep) == 0 and len(poster.calls) == 3 and len(slept) == 2
    dead = notifier(FakePoster([OSError("down")] * 50), clock, backoff_s=1.0)
    dead.notify(event())
    assert dead.flush(10, sleep) == 1  # gives up at its deadline; the event is counted as left
