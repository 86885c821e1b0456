"""The vast.ai client against the STRICT fake: error semantics from the body, pacing, 429s, late commits.

What these prove (issue 15): a 404 is read by its body ("no such instance" vs an expired session vs an offer
taken vs a 404 we cannot explain); a refused key stops with a message naming where the key came from; one key
never goes faster than vast allows (10 creates in a row: no 429) and a 429 without Retry-After is waited out
and said; a create that commits after the client gave up is found by its label instead of renting twice.
Also: the fake itself refuses what the real API refuses (auth on every route, unknown shapes).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reconciler.adapters.marketplace.vastai import (
    AUTH_KINDS,
    KIND_KEY_REFUSED,
    KIND_NO_SUCH_INSTANCE,
    KIND_OFFER_TAKEN,
    KIND_PERMISSION,
    KIND_RATE_LIMITED,
    KIND_SESSION_EXPIRED,
    KIND_UNEXPLAINED_404,
    GcraBucket,
    Pacing,
    RetryPolicy,
    Timeouts,
    VastAiMarketplace,
    classify_error,
)
from reconciler.domain import errors
from reconciler.domain.marketplace import (
    InstanceRequest,
    MarketplaceAuthError,
    MarketplaceRateLimitedError,
    OfferQuery,
    OfferTakenError,
    TemporaryMarketplaceError,
    is_truncated,
)
from tests.vast_fake import STATUSES, VastFake, market_of

KEY = "vk-strict-0123456789abcdef"
IMAGE = "registry.example/worker@sha256:" + "cd" * 32


@pytest.fixture
def fake() -> Iterator[VastFake]:
    with VastFake(api_key=KEY, offers=market_of(12)) as server:
        yield server


def client_for(fake: VastFake, said: list[str] | None = None, **overrides: Any) -> VastAiMarketplace:
    settings: dict[str, Any] = {
        "base_url": fake.base_url, "clock": fake.clock, "sleep": fake.clock.sleep, "jitter": lambda: 0.0,
        "retry": RetryPolicy(max_attempts=3), "key_source": "the stack secret fleet:vastaiApiKey",
        "notify": (said.append if said is not None else None),
    }
    api_key = overrides.pop("api_key", KEY)
    settings.update(overrides)
    return VastAiMarketplace(api_key, **settings)


def request(label: str) -> InstanceRequest:
    return InstanceRequest(image=IMAGE, disk_gb=100, label=label, env={"FLEET_INSTANCE_ID": label})


# --- error semantics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "body", "kind"), [
    (401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}, KIND_KEY_REFUSED),
    (404, {"success": False, "msg": "Session expired. Please log in again."}, KIND_SESSION_EXPIRED),
    (403, {"success": False, "error": "authorization_required", "msg": "2FA"}, KIND_PERMISSION),
    (404, {"success": False, "error": "no_such_ask", "msg": "Instance type by id 9 is not available."},
     KIND_OFFER_TAKEN),
    (404, {"msg": "Instance type by id 9 is not available."}, KIND_OFFER_TAKEN),
    (404, {"success": False, "error": "no_such_instance", "msg": "Instance 5 not found."}, KIND_NO_SUCH_INSTANCE),
    (404, {"detail": "Not found."}, KIND_UNEXPLAINED_404),
    (404, "<html>nginx 404</html>", KIND_UNEXPLAINED_404),
    (429, "API requests too frequent: endpoint threshold=4.5", KIND_RATE_LIMITED),
])
def test_errors_are_read_from_the_body(status: int, body: Any, kind: str) -> None:
    error = classify_error(status, body, body if isinstance(body, str) else "")
    assert error.kind == kind
    assert error.is_auth == (kind in AUTH_KINDS)


def test_a_key_revoked_mid_run_stops_with_its_source_and_is_not_retried(fake: VastFake) -> None:
    client = client_for(fake)
    assert client.list_instances() == []
    fake.revoke_key(after_requests=0)
    before = len(fake.requests)
    with pytest.raises(MarketplaceAuthError) as caught:
        client.list_instances()
    assert caught.value.kind == KIND_KEY_REFUSED and caught.value.key_source == "the stack secret fleet:vastaiApiKey"
    assert "fleet:vastaiApiKey" in str(caught.value) and "Invalid user key" in str(caught.value)
    assert "no slot is dropped" in str(caught.value)
    assert len(fake.requests) == before + 1  # not retried: every try would fail the same way


def test_an_expired_session_404_is_not_an_instance_gone(fake: VastFake) -> None:
    client = client_for(fake)
    contract_id = client.create_instance("20001", request("p-0-aaaaaa"))
    fake.expire_session()
    for call in (lambda: client.get_instance(contract_id), lambda: client.destroy_instance(contract_id)):
        with pytest.raises(MarketplaceAuthError, match=r"session .* expired.*does not mean anything is gone"):
            call()
    fake.restore_key()
    assert client.get_instance(contract_id) is not None  # it was never gone
    assert len(fake.visible_instances()) == 1


def test_a_404_without_an_explanation_is_temporary_never_gone(fake: VastFake) -> None:
    client = client_for(fake)
    contract_id = client.create_instance("20001", request("p-0-aaaaaa"))
    fake.fail_next(9, status=404, body={"detail": "Not found."}, method="GET", path_prefix="/api/v0/instances/")
    with pytest.raises(TemporaryMarketplaceError, match="404 without saying what is missing"):
        client.get_instance(contract_id)
    fake.fail_next(9, status=404, body={"detail": "Not found."}, method="DELETE")
    with pytest.raises(TemporaryMarketplaceError, match="not reading it as 'gone'"):
        client.destroy_instance(contract_id)


def test_no_such_instance_is_gone(fake: VastFake) -> None:
    client = client_for(fake)
    assert client.get_instance("7999999") is None  # 200 {"instances": null}
    client.destroy_instance("7999999")  # 404 no_such_instance: already gone, idempotent


def test_a_scoped_key_without_instance_write_gets_a_permission_error_naming_what_is_missing(fake: VastFake) -> None:
    fake.add_key("vk-readonly", permissions={"misc", "instance_read"})
    client = client_for(fake, api_key="vk-readonly", key_source="the environment variable VAST_API_KEY")
    assert client.search_offers(OfferQuery(gpu_name="RTX 4090", min_reliability=0.9))  # misc: allowed
    assert client.list_instances() == []  # instance_read: allowed
    with pytest.raises(MarketplaceAuthError) as caught:
        client.create_instance("20001", request("p-0-aaaaaa"))
    message = str(caught.value)
    assert caught.value.kind == KIND_PERMISSION
    assert "VAST_API_KEY" in message and "instance_write" in message and "PUT /api/v0/asks/20001/" in message
    assert "rejected the API key" not in message  # the old, wrong cause
    assert fake.visible_instances() == []


def test_offer_taken_is_its_own_error(fake: VastFake) -> None:
    fake.stale_offer(20001)
    with pytest.raises(OfferTakenError, match="20001 is no longer available"):
        client_for(fake).create_instance("20001", request("p-0-aaaaaa"))


# --- pacing and 429 -------------------------------------------------------------------------------------------


def test_ten_creates_in_a_row_are_paced_under_the_limit_and_say_so(fake: VastFake) -> None:
    said: list[str] = []
    client = client_for(fake, said)
    ids = [client.create_instance(str(20001 + i), request(f"p-{i}-00000{i}")) for i in range(10)]
    assert len(set(ids)) == 10 and len(fake.visible_instances()) == 10
    assert all(r.status != 429 for r in fake.requests)  # never over the limit
    creates = fake.requests_to("PUT", "/api/v0/asks/")
    gaps = [b.at - a.at for a, b in itertools.pairwise(creates)]
    assert min(gaps) >= 4.5
    assert sum("waiting 5.0 s before PUT" in line and "one create per 5 s" in line for line in said) == 9


def test_a_429_without_retry_after_is_waited_out_past_the_penalty_and_said(fake: VastFake) -> None:
    said: list[str] = []
    # A client paced too fast (1 s): the fake's real limit (4.5 s, 12 s penalty) answers 429 in plain text.
    client = client_for(fake, said, pacing=Pacing(create_interval_s=1.0))
    ids = [client.create_instance(str(20001 + i), request(f"p-{i}-00000{i}")) for i in range(3)]
    assert len(set(ids)) == 3 and len(fake.visible_instances()) == 3
    limited = [r for r in fake.requests if r.status == 429]
    assert limited and all("retry-after" not in r.headers for r in limited)
    assert any("rate limited (HTTP 429: API requests too frequent: endpoint threshold=4.5)" in line
               and "waiting 13.0 s (no Retry-After; create penalty)" in line for line in said)


def test_rate_limited_too_long_gives_up_with_a_temporary_error(fake: VastFake) -> None:
    fake.rate_limit_next(99, method="POST")
    with pytest.raises(TemporaryMarketplaceError, match="still rate limited after 3 waits"):
        client_for(fake, pacing=Pacing(max_rate_limited=3)).search_offers(OfferQuery(gpu_name="RTX 4090"))


def test_clients_of_one_key_share_its_pace(fake: VastFake) -> None:
    a, b = client_for(fake), client_for(fake)
    a.create_instance("20001", request("p-0-000000"))
    b.create_instance("20002", request("p-1-000001"))
    first, second = fake.requests_to("PUT", "/api/v0/asks/")
    assert second.at - first.at >= 4.5 and not any(r.status == 429 for r in fake.requests)


def test_gcra_bucket_spaces_calls_and_honours_a_block() -> None:
    bucket = GcraBucket(rate_per_s=2.0, burst=2)
    assert [bucket.reserve(0.0) for _ in range(4)] == [0.0, 0.0, 0.5, 1.0]
    bucket.block(10.0)
    assert bucket.reserve(1.0) == 10.0 and bucket.reserve(1.0) == 10.5


# --- slow creates that commit after the client gave up -----------------------------------------------------------


def test_a_create_that_commits_after_the_client_gave_up_is_found_not_rented_twice(fake: VastFake) -> None:
    said: list[str] = []
    fake.late_commit_next(commit_after_s=25.0, hold_s=0.6)
    client = client_for(fake, said, timeouts=Timeouts(create_s=0.2))
    contract_id = client.create_instance("20001", request("p-0-c0ffee"))
    assert fake.instances_with_label("p-0-c0ffee") == [int(contract_id)]
    assert len(fake.requests_to("PUT", "/api/v0/asks/")) == 1
    assert fake.clock.calls[:3] == [5.0, 10.0, 15.0]  # looked at 0, 5, 15, 30 s: committed at 25 s
    assert any("looking again in" in line and "a create can commit late" in line for line in said)


def test_a_commit_later_than_the_window_rents_again_and_leaves_two_for_the_provider_to_settle(
        fake: VastFake) -> None:
    fake.late_commit_next(commit_after_s=400.0, hold_s=0.6)
    client = client_for(fake, timeouts=Timeouts(create_s=0.2))
    # After the 120 s window the retry finds the offer taken (by our own late rental): the provider tries the
    # next offer with the same label.
    with pytest.raises(OfferTakenError):
        client.create_instance("20001", request("p-0-c0ffee"))
    client.create_instance("20002", request("p-0-c0ffee"))
    fake.clock.advance(400.0)
    # The slot provider's duplicate check (same label twice) keeps one and destroys the other.
    assert len(client.instances_labelled(["p-0-c0ffee"])) == 2


def test_an_unreadable_list_after_an_ambiguous_create_stops_instead_of_renting_again(fake: VastFake) -> None:
    fake.drop_next(1, method="PUT")
    fake.fail_next(9, status=503, method="GET", path_prefix="/api/v1/instances/")
    with pytest.raises(TemporaryMarketplaceError, match="not retrying, to avoid renting twice"):
        client_for(fake).create_instance("20001", request("p-0-c0ffee"))
    assert len(fake.requests_to("PUT", "/api/v0/asks/")) == 1


# --- the fake is strict --------------------------------------------------------------------------------------


ROUTES: list[tuple[str, str, Any]] = [
          ("POST", "/api/v0/bundles/", {}), ("PUT", "/api/v0/asks/20001/", {}), ("GET", "/api/v1/instances/", None),
          ("GET", "/api/v0/instances/", None), ("GET", "/api/v0/instances/7100001/", None),
          ("DELETE", "/api/v0/instances/7100001/", {}), ("GET", "/api/v0/users/current/", None)]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_the_fake_enforces_auth_on_every_route(fake: VastFake, method: str, path: str, body: Any) -> None:
    url = fake.root_url + path
    refused = 404 if path == "/api/v0/bundles/" else 401  # search: 404 "Invalid user key" (vast-ai/docs)
    assert httpx.request(method, url, json=body).status_code == refused
    wrong = httpx.request(method, url, json=body, headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()["msg"]) == (refused, "Invalid user key")
    fake.expire_session()
    expired = httpx.request(method, url, json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert (expired.status_code, expired.json()["msg"]) == (404, "Session expired. Please log in again.")
    assert httpx.request(method, url + "?api_key=" + KEY, json=body).status_code == 400


def test_the_fake_refuses_unknown_shapes(fake: VastFake) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    url = fake.base_url
    good = {"client_id": "me", "image": IMAGE, "disk": 10, "label": "x", "env": {}}
    for bad, why in [({**good, "ssh": True}, "unknown field"), ({**good, "client_id": 7}, "client_id"),
                     ({**good, "env": "-e A=1"}, "env must be an object"), ({**good, "disk": 0}, "disk"),
                     ({**good, "runtype": "docker"}, "runtype"), ([good], "JSON object")]:
        fake.clock.advance(5.0)  # one create per 4.5 s
        answer = httpx.put(f"{url}/asks/20001/", json=bad, headers=auth)
        assert answer.status_code == 400 and why in answer.json()["msg"], (bad, answer.text)
    for query, why in [({"gpu_nam": {"eq": "x"}}, "unknown search field"), ({"gpu_name": "x"}, "must be an object"),
                       ({"dph_total": {"lte": "1"}}, "needs a number"), ({"order": "dph_total"}, "order")]:
        fake.clock.advance(1.0)
        answer = httpx.post(f"{url}/bundles/", json=query, headers=auth)
        assert answer.status_code == 400 and why in answer.json()["msg"], (query, answer.text)
    assert httpx.request("DELETE", f"{url}/instances/1/", json={"x": 1}, headers=auth).status_code == 400


def test_the_fake_reports_every_status_with_consistent_fields(fake: VastFake) -> None:
    client = client_for(fake)
    contract_id = client.create_instance("20001", request("p-0-aaaaaa"))
    seen = []
    for status in STATUSES:
        fake.set_status(contract_id, status)
        fake.clock.advance(1.0)
        instance = client.get_instance(contract_id)
        assert instance is not None
        seen.append(instance.status)
        row = fake.visible_instances()[0]
        if status in ("stopped", "frozen", "running"):
            assert row["intended_status"] == row["cur_state"] == status
    assert seen == ["loading", "loading", "scheduling", "loading", "running", "stopped", "frozen", "exited",
                    "rebooting", "unknown", "offline"]
    with pytest.raises(ValueError, match="unknown actual_status"):
        fake.set_status(contract_id, "paused")
    fake.schedule_status(contract_id, 60.0, "offline", "host went away")
    fake.set_status(contract_id, "running")
    fake.schedule_status(contract_id, 60.0, "offline", "host went away")
    assert client.get_instance(contract_id).status == "running"  # type: ignore[union-attr]
    fake.clock.advance(61.0)
    assert client.get_instance(contract_id).status == "offline"  # type: ignore[union-attr]


def test_the_fake_filters_the_v1_list_by_label_and_hides_other_accounts(fake: VastFake) -> None:
    fake.add_instance(label="gpu-fleet/main/p-0-aaaaaa")
    fake.add_instance(label="someone-else")
    fake.add_instance(label="gpu-fleet/main/p-0-aaaaaa", account="acct-other")
    answer = httpx.get(f"{fake.root_url}/api/v1/instances/", headers={"Authorization": f"Bearer {KEY}"},
                       params={"select_filters": json.dumps({"label": {"in": ["gpu-fleet/main/p-0-aaaaaa"]}})})
    assert [r["label"] for r in answer.json()["instances"]] == ["gpu-fleet/main/p-0-aaaaaa"]


# --- issue 23: what vast-ai/docs' current API reference says --------------------------------------------------


def test_search_with_a_bad_key_is_a_404_invalid_user_key_and_stops_naming_its_source(fake: VastFake) -> None:
    url = fake.root_url + "/api/v0/bundles/"
    for headers in ({}, {"Authorization": "Bearer nope"}):
        answer = httpx.post(url, json={}, headers=headers)
        assert (answer.status_code, answer.json()["msg"]) == (404, "Invalid user key")
    client = client_for(fake)
    fake.revoke_key()
    before = len(fake.requests)
    with pytest.raises(MarketplaceAuthError) as caught:
        client.search_offers(OfferQuery(gpu_name="RTX 4090", max_price_usd_per_hour=1.0))
    assert caught.value.kind == KIND_KEY_REFUSED and "fleet:vastaiApiKey" in str(caught.value)
    assert "HTTP 404: Invalid user key" in str(caught.value) and "no slot is dropped" in str(caught.value)
    assert len(fake.requests) == before + 1  # stopped at once, like the 401: never retried as a temporary 404


def test_the_daily_search_quota_is_honoured_to_its_retry_after_without_hammering(fake: VastFake) -> None:
    said: list[str] = []
    client = client_for(fake, said)
    query = OfferQuery(gpu_name="RTX 4090", max_price_usd_per_hour=1.0)
    fake.exhaust_search_quota(retry_after_s=3 * 3600)
    with pytest.raises(MarketplaceRateLimitedError) as caught:
        client.search_offers(query)
    error = caught.value
    assert error.temporary and error.reason == errors.RATE_LIMITED and error.retry_after_s == 3 * 3600
    assert "search_quota_exceeded" in str(error) and "Retry-After 10800 s" in str(error), str(error)
    assert "not searching again before it passes, in 3.0 h" in str(error)
    assert len(fake.requests_to("POST", "/api/v0/bundles/")) == 1
    assert max(fake.clock.sleeps, default=0.0) < 60  # never waited hours inside one call
    # Every later search in this process stops before the server until the quota resets: nobody hammers.
    fake.clock.advance(2 * 3600)
    with pytest.raises(MarketplaceRateLimitedError, match=r"in 1\.0 h"):
        client_for(fake).search_offers(query)  # another client of the same key shares the wait
    assert len(fake.requests_to("POST", "/api/v0/bundles/")) == 1
    fake.clock.advance(3600)
    assert len(client.search_offers(query)) == 12
    assert [r.status for r in fake.requests_to("POST", "/api/v0/bundles/")] == [429, 200]
    assert any("search quota" in line and "Retry-After 10800 s" in line for line in said), said


def test_rented_is_filtered_on_the_client_because_the_server_drops_it(fake: VastFake) -> None:
    # An offer on a machine this account already rents: `rented: true` and still rentable (a multi-GPU box).
    fake.offers[20001]["rented"] = True
    raw = httpx.post(fake.base_url + "/bundles/", json={"rented": {"eq": False}, "limit": 100},
                     headers={"Authorization": f"Bearer {KEY}"}).json()
    assert 20001 in [o["id"] for o in raw["offers"]]  # the strict fake, as the server: the key is dropped
    offers = client_for(fake).search_offers(OfferQuery(gpu_name="RTX 4090", max_price_usd_per_hour=1.0))
    assert "20001" not in [o.offer_id for o in offers] and len(offers) == 11


def test_a_truncated_search_answer_is_never_read_as_complete(fake: VastFake) -> None:
    fake.max_results = 5  # the server cuts its answer short and says so
    offers = client_for(fake).search_offers(OfferQuery(gpu_name="RTX 4090", max_price_usd_per_hour=1.0))
    assert len(offers) == 5 and is_truncated(offers)
    fake.max_results = None
    assert not is_truncated(client_for(fake).search_offers(OfferQuery(gpu_name="RTX 4090",
                                                                      max_price_usd_per_hour=1.0)))


def test_an_older_not_found_on_destroy_is_gone_only_once_show_instance_confirms_it(fake: VastFake) -> None:
    client = client_for(fake)
    older = {"success": False, "error": "not_found", "msg": "Instance not found"}
    # Still there (show-instance lists it): the 404 is not read as gone.
    contract_id = client.create_instance("20001", request("p-0-aaaaaa"))
    fake.fail_next(1, status=404, body=older, method="DELETE")
    with pytest.raises(TemporaryMarketplaceError, match="show-instance still lists it"):
        client.destroy_instance(contract_id)
    assert len(fake.visible_instances()) == 1
    # Really gone: show-instance answers {"instances": null}, and the destroy is done.
    fake.fail_next(1, status=404, body=older, method="DELETE", after_work=True)
    client.destroy_instance(contract_id)
    assert fake.visible_instances() == []
    shows = fake.requests_to("GET", f"/api/v0/instances/{contract_id}/")
    assert len(shows) == 2 and shows[-1].status == 200
