"""The vast.ai adapter against a real HTTP fake of the vast.ai API on 127.0.0.1.

What these prove: the exact requests the client sends (query body, create body, pagination), that answers
come back as the port's dataclasses, and how every failure class is handled (retry with the injected sleep,
permanent errors, no double rent after an ambiguous create, the API key never leaking).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reconciler.adapters.marketplace.vastai import (
    ONSTART_MAX_CHARS,
    RetryPolicy,
    Timeouts,
    VastAiMarketplace,
    build_create_body,
    check_env,
    docker_env_flags,
    normalise_status,
    parse_offers,
    retry_delay,
)
from reconciler.domain.marketplace import (
    InstanceRequest,
    MarketplaceAuthError,
    MarketplaceRateLimitedError,
    Offer,
    OfferQuery,
    OfferTakenError,
    PermanentMarketplaceError,
    TemporaryMarketplaceError,
)
from reconciler.domain.ranking import mismatch
from tests.vast_fake import Fault, VastFake, VirtualClock, make_offer, offer_matches

API_KEY = "vk-7f3e9a1c5b2d4e6f8091a2b3c4d5e6f7"
SOME_ENV = {
    "FLEET_CONTROLLER_URL": "https://controller.example:8443",
    "FLEET_GPU_NAME": "RTX 4090",
    "FLEET_INSTANCE_ID": "rtx4090-0-3f9a1c",
    "FLEET_TOKEN": "c0ffee" * 10,
    "FLEET_IMAGE_DIGEST": "registry.example/worker@sha256:" + "ab" * 32,
}




@pytest.fixture
def fake() -> Iterator[VastFake]:
    with VastFake(api_key=API_KEY) as server:
        yield server


@pytest.fixture
def sleeps(fake: VastFake) -> VirtualClock:
    """The fake's clock: the client's pacing and backoff sleep on it (recorded in `.calls`, no real wait)."""
    return fake.clock


def make_client(fake: VastFake, sleeps: VirtualClock, **overrides: Any) -> VastAiMarketplace:
    settings: dict[str, Any] = {
        "base_url": fake.base_url,
        "clock": fake.clock,
        "sleep": sleeps.sleep,
        "jitter": lambda: 0.0,
        "retry": RetryPolicy(max_attempts=4, base_delay_s=1.0, max_delay_s=30.0, max_retry_after_s=60.0),
        "timeouts": Timeouts(connect_s=2.0, read_s=5.0, write_s=5.0, pool_s=2.0),
    }
    api_key = overrides.pop("api_key", API_KEY)
    settings.update(overrides)
    return VastAiMarketplace(api_key, **settings)


@pytest.fixture
def client(fake: VastFake, sleeps: VirtualClock) -> Iterator[VastAiMarketplace]:
    with make_client(fake, sleeps) as marketplace:
        yield marketplace


def request_for(label: str, **overrides: Any) -> InstanceRequest:
    fields: dict[str, Any] = {
        "image": "registry.example/worker@sha256:" + "ab" * 32,
        "disk_gb": 120,
        "label": label,
        "env": SOME_ENV,
        "onstart": None,
        "image_login": None,
    }
    fields.update(overrides)
    return InstanceRequest(**fields)


# --------------------------------------------------------------------------------------------------
# search


def test_search_sends_the_exact_query_and_returns_offers(fake: VastFake, client: VastAiMarketplace) -> None:
    query = OfferQuery(
        gpu_name="RTX 4090",
        max_price_usd_per_hour=0.6,
        min_reliability=0.95,
        min_inet_down_mbps=500,
        min_disk_gb=200,
        min_cpu_ram_gb=128,
        min_cuda=12.4,
        exclude_machine_ids=frozenset({"41003", "41002"}),
        limit=20,
    )
    offers = client.search_offers(query)

    [sent] = fake.requests
    assert (sent.method, sent.path) == ("POST", "/api/v0/bundles/")
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.body == {
        "gpu_name": {"eq": "RTX 4090"},
        "num_gpus": {"eq": 1},
        "dph_total": {"lte": 0.6},
        "reliability": {"gte": 0.95},
        "inet_down": {"gte": 500},
        "disk_space": {"gte": 200},
        "cpu_ram": {"gte": 128_000},  # the API counts MB
        "cuda_max_good": {"gte": 12.4},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "external": {"eq": False},
        "verified": {"eq": True},
        "machine_id": {"notin": [41002, 41003]},  # integers, as vast's machine ids are
        "allocated_storage": 200,
        "order": [["dph_total", "asc"]],
        "limit": 20,
        "type": "on-demand",
    }
    # 41002/41003 excluded; 41004 unreliable, 41005 unverified, 41006 too little RAM; RTX PRO 4000 other GPU.
    assert offers == [
        Offer(
            offer_id="9001",
            machine_id="41001",
            host_id="501",
            gpu_name="RTX 4090",
            num_gpus=1,
            price_usd_per_hour=0.45,
            reliability=0.991,
            inet_down_mbps=900.0,
            disk_gb=500.0,
            cpu_ram_gb=257.0,
            cuda_max_good=12.8,
            verified=True,
            geolocation="Norway, NO",
        )
    ]


def test_search_omits_verified_and_exclusions_when_not_asked(fake: VastFake, client: VastAiMarketplace) -> None:
    offers = client.search_offers(OfferQuery(gpu_name="RTX PRO 4000", verified_only=False, min_reliability=0.9))
    body = fake.requests[0].body
    assert "verified" not in body
    assert "machine_id" not in body
    assert "allocated_storage" not in body
    assert [(o.offer_id, o.gpu_name) for o in offers] == [("9004", "RTX PRO 4000")]


def test_non_numeric_machine_ids_are_sent_as_strings(fake: VastFake, client: VastAiMarketplace) -> None:
    client.search_offers(OfferQuery(gpu_name="RTX 4090", exclude_machine_ids=frozenset({"41001", "m-legacy"})))
    assert fake.requests[0].body["machine_id"] == {"notin": [41001, "m-legacy"]}


def test_what_the_api_ignored_is_filtered_once_by_the_fit_rule(
    fake: VastFake, client: VastAiMarketplace, caplog: pytest.LogCaptureFixture
) -> None:
    # The server drops these filters (the real API only warns on fields it does not know). The adapter does not
    # decide fit (no second copy of the rule): it returns what is for rent, and the one fit rule the slot provider
    # ranks with (reconciler.domain.ranking) drops the rest, bad machine first.
    fake.ignored_fields = {"machine_id", "reliability", "verified", "cpu_ram", "gpu_name", "dph_total"}
    query = OfferQuery(gpu_name="RTX 4090", max_price_usd_per_hour=0.5, min_cpu_ram_gb=128,
                       exclude_machine_ids=frozenset({"41002"}))
    offers = client.search_offers(query)
    assert {o.machine_id for o in offers} > {"41001", "41002"}
    reasons = {o.machine_id: mismatch(o, query) for o in offers}
    assert [m for m, why in reasons.items() if why is None] == ["41001"]
    assert reasons["41002"] == "machine 41002 is recorded bad"
    assert any(why and why.startswith("reliability 0.81 below 0.95") for why in reasons.values())
    assert any(why and why.startswith("gpu 'RTX PRO 4000'") for why in reasons.values())


def test_rows_not_for_rent_are_dropped_by_the_adapter(fake: VastFake, client: VastAiMarketplace) -> None:
    # `rented` is no server-side filter (the CLI filters the rows itself): the adapter drops such rows, as it
    # drops rows vast marks not rentable, whatever the pool wants.
    rows = [make_offer(9201, 44001, 701, rented=True), make_offer(9202, 44002, 702, rentable=False),
            make_offer(9203, 44003, 703)]
    fake.fail_next(status=200, body={"offers": rows}, method="POST")
    offers = client.search_offers(OfferQuery(gpu_name="RTX 4090"))
    assert [o.offer_id for o in offers] == ["9203"]
    assert getattr(offers, "dropped", None) == 2


def test_malformed_offers_are_skipped_with_a_warning(
    fake: VastFake, client: VastAiMarketplace, caplog: pytest.LogCaptureFixture
) -> None:
    good = make_offer(9101, 43001, 601, dph_total=0.4)
    rows = [
        "not an offer",
        {k: v for k, v in make_offer(9102, 43002, 602).items() if k != "host_id"},
        make_offer(9103, 43003, 603, dph_total="cheap"),
        make_offer(9104, 43004, 604, num_gpus=0.5),
        make_offer(9105, 43005, 605, reliability=None, reliability2=None),  # unknown reliability: unreliable
        good,
    ]
    fake.fail_next(status=200, body={"offers": rows}, method="POST")
    caplog.set_level(logging.WARNING, logger="reconciler.adapters.marketplace.vastai")
    query = OfferQuery(gpu_name="RTX 4090")
    offers = client.search_offers(query)
    assert [o.offer_id for o in offers] == ["9105", "9101"]
    # unknown reliability reads as 0.0, which the fit rule refuses
    assert [o.offer_id for o in offers if mismatch(o, query) is None] == ["9101"]
    assert "skipping malformed offer #0: offer is not an object" in caplog.text
    assert "#1: missing host_id" in caplog.text
    assert "#2: dph_total is not a number: 'cheap'" in caplog.text
    assert "#3: num_gpus is not a positive integer" in caplog.text


def test_search_reads_reliability2_when_reliability_is_absent() -> None:
    raw = make_offer(1, 2, 3, reliability=None, reliability2=0.97)
    [offer] = parse_offers({"offers": [raw]})
    assert offer.reliability == 0.97


def test_garbage_json_is_retried_then_temporary(
    fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock
) -> None:
    fake.garbage_next(1)
    assert [o.offer_id for o in client.search_offers(OfferQuery(gpu_name="RTX PRO 4000"))] == ["9004"]
    assert len(sleeps.calls) == 1

    fake.garbage_next(4)
    with pytest.raises(TemporaryMarketplaceError, match="failed after 4 attempts: unparseable response body"):
        client.search_offers(OfferQuery(gpu_name="RTX PRO 4000"))


def test_response_without_offers_list_is_temporary(fake: VastFake, client: VastAiMarketplace) -> None:
    fake.fail_next(status=200, body={"offers": "none today"})
    with pytest.raises(TemporaryMarketplaceError, match="no 'offers' list"):
        client.search_offers(OfferQuery(gpu_name="RTX 4090"))


# --------------------------------------------------------------------------------------------------
# create


def test_create_sends_the_exact_body_and_returns_new_contract(fake: VastFake, client: VastAiMarketplace) -> None:
    onstart = "echo started >> /var/log/onstart.log"
    contract_id = client.create_instance(
        "9002", request_for("rtx4090-0-3f9a1c", onstart=onstart, image_login="-u bot -p pw registry.example")
    )

    [sent] = fake.requests
    assert (sent.method, sent.path) == ("PUT", "/api/v0/asks/9002/")
    assert sent.body == {
        "client_id": "me",
        "image": "registry.example/worker@sha256:" + "ab" * 32,
        "disk": 120,
        "label": "rtx4090-0-3f9a1c",
        "env": SOME_ENV,
        "runtype": "args",
        "onstart": onstart,
        "image_login": "-u bot -p pw registry.example",
    }
    assert contract_id == str(next(iter(fake.instances)))
    instance = client.get_instance(contract_id)
    assert instance is not None
    assert (instance.label, instance.machine_id, instance.host_id) == ("rtx4090-0-3f9a1c", "41002", "501")


def test_create_on_a_taken_offer_is_permanent_with_the_api_message(
    fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock
) -> None:
    client.create_instance("9001", request_for("a-0-aaaaaa"))
    with pytest.raises(OfferTakenError, match=r"HTTP 404.*Instance type by id 9001 is not available"):
        client.create_instance("9001", request_for("a-0-bbbbbb"))
    assert sleeps.calls == [5.0]  # only the pacing between two creates of one key: no retry of a taken offer
    assert len(fake.instances) == 1


def test_create_success_false_is_permanent_with_the_api_message(fake: VastFake, client: VastAiMarketplace) -> None:
    fake.fail_next(status=200, body={"success": False, "error": "insufficient_credit", "msg": "Not enough credit"})
    with pytest.raises(PermanentMarketplaceError, match=r"vast\.ai refused offer 9001: Not enough credit"):
        client.create_instance("9001", request_for("a-0-aaaaaa"))


def test_create_400_is_permanent(fake: VastFake, client: VastAiMarketplace) -> None:
    fake.fail_next(status=400, body={"success": False, "error": "invalid_args", "msg": "disk too large"})
    with pytest.raises(PermanentMarketplaceError, match=r"HTTP 400: disk too large"):
        client.create_instance("9001", request_for("a-0-aaaaaa"))


def test_env_is_an_object_of_checked_values() -> None:
    assert check_env(SOME_ENV) == SOME_ENV
    assert check_env({"FLEET_GPU_NAME": "RTX PRO 4000"}) == {"FLEET_GPU_NAME": "RTX PRO 4000"}
    assert docker_env_flags({"A": "1", "FLEET_POOL": "rtx4090", "FLEET_GPU_NAME": "RTX 4090", "EMPTY": ""}) == (
        "-e A=1 -e FLEET_POOL=rtx4090 -e FLEET_GPU_NAME='RTX 4090' -e EMPTY="
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLEET_TOKEN": "abc\tdef"}, r"value of FLEET_TOKEN contains .*'\\t'"),
        ({"FLEET_TOKEN": "abc'; rm -rf /"}, r"value of FLEET_TOKEN contains .*\"'\""),
        ({"FLEET_TOKEN": "$(reboot)"}, r"value of FLEET_TOKEN contains .*'\$'"),
        ({"FLEET_TOKEN": "line\nnext"}, r"value of FLEET_TOKEN contains .*'\\n'"),
        ({"-v /:/host": "1"}, r"'-v /:/host' is not a valid environment variable name"),
        ({"1BAD": "x"}, r"'1BAD' is not a valid environment variable name"),
    ],
)
def test_unsafe_env_is_rejected_before_any_request(
    fake: VastFake, client: VastAiMarketplace, env: dict[str, str], message: str
) -> None:
    with pytest.raises(PermanentMarketplaceError, match=message) as caught:
        client.create_instance("9001", request_for("a-0-aaaaaa", env=env))
    for value in env.values():
        if len(value) > 1:
            assert value not in str(caught.value)  # the value may be the token
    assert fake.requests == []


def test_onstart_longer_than_vast_accepts_is_rejected(fake: VastFake, client: VastAiMarketplace) -> None:
    too_long = "#" * (ONSTART_MAX_CHARS + 1)
    with pytest.raises(PermanentMarketplaceError, match=f"onstart is {ONSTART_MAX_CHARS + 1} characters"):
        client.create_instance("9001", request_for("a-0-aaaaaa", onstart=too_long))
    assert fake.requests == []
    assert build_create_body(request_for("a-0-aaaaaa", onstart="#" * ONSTART_MAX_CHARS))["onstart"]


def test_create_after_ambiguous_timeout_finds_the_instance_instead_of_renting_twice(
    fake: VastFake, sleeps: VirtualClock
) -> None:
    # vast rents the machine, but the answer arrives after our read timeout.
    fake.slow_next(1, delay_s=3.0, method="PUT")
    with make_client(fake, sleeps, timeouts=Timeouts(connect_s=2.0, create_s=0.3)) as client:
        contract_id = client.create_instance("9001", request_for("rtx4090-1-c0ffee"))

    assert len(fake.instances) == 1
    assert contract_id == str(next(iter(fake.instances)))
    assert [(r.method, r.path) for r in fake.requests] == [
        ("PUT", "/api/v0/asks/9001/"),
        ("GET", "/api/v1/instances/"),
    ]
    assert sleeps.calls == []  # committed at once: found on the first look, no wait


def test_create_after_ambiguous_5xx_with_no_instance_retries(
    fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock
) -> None:
    fake.fail_next(1, status=502, method="PUT")
    contract_id = client.create_instance("9001", request_for("rtx4090-1-c0ffee"))
    # No instance carries the label: looked for over the 120 s commit window, then rented again.
    assert [(r.method, r.path) for r in fake.requests] == [
        ("PUT", "/api/v0/asks/9001/"), *[("GET", "/api/v1/instances/")] * 6, ("PUT", "/api/v0/asks/9001/"),
    ]
    lookups = fake.requests_to("GET", "/api/v1/instances/")
    assert all(json.loads(r.query["select_filters"][0]) == {"label": {"in": ["rtx4090-1-c0ffee"]}} for r in lookups)
    assert list(fake.instances) == [int(contract_id)]
    assert sleeps.calls == [5.0, 10.0, 15.0, 30.0, 60.0]


def test_create_after_a_lost_answer_following_the_work_is_not_repeated(
    fake: VastFake, client: VastAiMarketplace
) -> None:
    fake.fail_next(1, status=502, method="PUT", after_work=True)
    contract_id = client.create_instance("9001", request_for("rtx4090-1-c0ffee"))
    assert len(fake.requests_to("PUT", "/api/v0/asks/")) == 1
    assert list(fake.instances) == [int(contract_id)]


def test_create_is_not_retried_when_the_instance_list_cannot_be_read(
    fake: VastFake, client: VastAiMarketplace
) -> None:
    fake.garbage_next(1, method="PUT")
    fake.fail_next(4, status=503, method="GET", path_prefix="/api/v1/instances/")
    with pytest.raises(TemporaryMarketplaceError, match="not retrying, to avoid renting twice"):
        client.create_instance("9001", request_for("rtx4090-1-c0ffee"))
    assert len(fake.requests_to("PUT", "/api/v0/asks/")) == 1
    assert len(fake.instances) == 1  # the garbled answer hid a real rental; the caller must look for the label


def test_create_rate_limited_is_retried_without_a_label_check(
    fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock
) -> None:
    fake.rate_limit_next(1, retry_after=4, method="PUT")
    client.create_instance("9001", request_for("rtx4090-1-c0ffee"))
    assert [r.method for r in fake.requests] == ["PUT", "PUT"]  # a 429 was never acted on
    assert sleeps.calls == [5.0]  # Retry-After 4 s, but the refused create still used the key's 5 s slot


# --------------------------------------------------------------------------------------------------
# retries and errors


def test_429_then_200_sleeps_for_retry_after(fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock) -> None:
    fake.rate_limit_next(1, retry_after=7)
    offers = client.search_offers(OfferQuery(gpu_name="RTX PRO 4000"))
    assert [o.offer_id for o in offers] == ["9004"]
    assert sleeps.calls == [7.0]
    assert len(fake.requests) == 2


def test_a_retry_after_longer_than_a_call_waits_is_honoured_never_retried_earlier(
        fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock) -> None:
    # Issue 23: this used to sleep 60 s and try again within the hour vast asked for. Now the error carries the
    # delay and the key's endpoint is held until it passes.
    fake.rate_limit_next(1, retry_after=3600)
    with pytest.raises(MarketplaceRateLimitedError, match="Retry-After 3600 s") as caught:
        client.list_instances()
    assert caught.value.retry_after_s == 3600 and sleeps.calls == []
    with pytest.raises(MarketplaceRateLimitedError, match=r"in 1\.0 h"):
        client.list_instances()
    assert len(fake.requests) == 1
    sleeps.advance(3600)
    assert client.list_instances() == [] and len(fake.requests) == 2


def test_5xx_exhausted_is_temporary_after_bounded_backoff(
    fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock
) -> None:
    fake.fail_next(10, status=500)
    with pytest.raises(TemporaryMarketplaceError, match=r"GET /api/v1/instances/ failed after 4 attempts: .*HTTP 500"):
        client.list_instances()
    assert len(fake.requests) == 4
    assert sleeps.calls == [0.5, 1.0, 2.0]  # jitter 0 -> half of 1, 2, 4


def test_backoff_is_jittered_and_bounded() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=10.0)
    assert retry_delay(1, policy, None, 0.0) == 0.5
    assert retry_delay(1, policy, None, 0.999) == pytest.approx(0.9995)
    assert retry_delay(8, policy, None, 0.999) <= 10.0
    assert retry_delay(3, policy, 2.5, 0.9) == 2.5


def test_timeout_is_retried(fake: VastFake, sleeps: VirtualClock) -> None:
    contract_id = fake.add_instance(label="x-0-000001")
    fake.slow_next(1, delay_s=3.0, method="GET")
    with make_client(fake, sleeps, timeouts=Timeouts(connect_s=2.0, read_s=0.3)) as client:
        instance = client.get_instance(str(contract_id))
    assert instance is not None and instance.label == "x-0-000001"
    assert len(fake.requests) == 2
    assert len(sleeps.calls) == 1


def test_dropped_connection_is_retried(fake: VastFake, client: VastAiMarketplace, sleeps: VirtualClock) -> None:
    fake.drop_next(1)
    assert client.list_instances() == []
    assert len(sleeps.calls) == 1


def test_connection_refused_is_temporary(sleeps: VirtualClock) -> None:
    with VastFake(api_key=API_KEY) as gone:
        base_url = gone.base_url
    client = VastAiMarketplace(API_KEY, base_url=base_url, clock=sleeps, sleep=sleeps.sleep,
                               retry=RetryPolicy(max_attempts=3))
    with pytest.raises(TemporaryMarketplaceError, match="failed after 3 attempts: cannot connect"):
        client.search_offers(OfferQuery(gpu_name="RTX 4090"))
    assert len(sleeps.calls) == 2


def test_rejected_key_is_permanent_and_never_shown(
    fake: VastFake, sleeps: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong_key = "vk-wrong-0123456789abcdef0123456789"
    client = make_client(fake, sleeps, api_key=wrong_key)
    for call in (
        lambda: client.search_offers(OfferQuery(gpu_name="RTX 4090")),
        lambda: client.create_instance("9001", request_for("a-0-aaaaaa")),
        client.list_instances,
    ):
        with pytest.raises(PermanentMarketplaceError, match=r"vast\.ai rejected the API key") as caught:
            call()
        assert wrong_key not in str(caught.value)
        assert wrong_key not in repr(caught.value)
    assert len(fake.requests) == 3  # not retried
    assert sleeps.calls == []
    assert fake.requests[0].headers["authorization"] == f"Bearer {wrong_key}"
    assert wrong_key not in repr(client)
    assert wrong_key not in repr(vars(client))
    assert wrong_key not in caplog.text


def test_403_is_the_same_permanent_error(fake: VastFake, client: VastAiMarketplace) -> None:
    fake.fail_next(status=403, body={"success": False, "error": "forbidden", "msg": "key lacks scope"})
    with pytest.raises(MarketplaceAuthError, match=r"forbids GET /api/v1/instances/ .*HTTP 403: key lacks scope.*"
                                                   r"instance_read") as caught:
        client.list_instances()
    assert caught.value.kind == "permission-denied"


def test_api_key_from_the_environment(fake: VastFake, sleeps: VirtualClock) -> None:
    client = VastAiMarketplace(base_url=fake.base_url, clock=sleeps, sleep=sleeps.sleep,
                               environ={"VAST_API_KEY": API_KEY})
    assert client.list_instances() == []
    with pytest.raises(PermanentMarketplaceError, match="set VAST_API_KEY"):
        VastAiMarketplace(base_url=fake.base_url, environ={})


def test_ids_that_are_not_numbers_are_refused_without_a_request(
    fake: VastFake, client: VastAiMarketplace
) -> None:
    with pytest.raises(PermanentMarketplaceError, match=r"offer id must be a number, got '9001/\.\./x'"):
        client.create_instance("9001/../x", request_for("a-0-aaaaaa"))
    with pytest.raises(PermanentMarketplaceError, match="contract id must be a number"):
        client.destroy_instance("abc")
    assert fake.requests == []


# --------------------------------------------------------------------------------------------------
# instances


def test_status_transitions_and_exited_is_dead(fake: VastFake, client: VastAiMarketplace) -> None:
    contract_id = client.create_instance("9003", request_for("rtx4090-2-abcdef"))
    fake.script_status(contract_id, ["loading", "running", "exited"])
    seen = []
    for _ in range(4):
        instance = client.get_instance(contract_id)
        assert instance is not None
        seen.append((instance.status, instance.is_dead))
    assert seen == [("loading", False), ("running", False), ("exited", True), ("exited", True)]

    fake.set_status(contract_id, "offline", status_msg="machine went offline")
    [listed] = client.list_instances()
    assert (listed.status, listed.is_dead, listed.status_msg) == ("offline", True, "machine went offline")


def test_status_normalisation() -> None:
    assert [normalise_status(s) for s in ("created", "scheduling", "loading", None, "Running", "stopped", 3)] == [
        "loading", "scheduling", "loading", "loading", "running", "stopped", "unknown",
    ]


def test_destroy_is_idempotent(fake: VastFake, client: VastAiMarketplace) -> None:
    contract_id = client.create_instance("9001", request_for("a-0-aaaaaa"))
    client.destroy_instance(contract_id)
    client.destroy_instance(contract_id)  # the fake answers 404 now
    assert [(r.method, r.path, r.body) for r in fake.requests_to("DELETE", "/api/v0/instances/")] == [
        ("DELETE", f"/api/v0/instances/{contract_id}/", {}),
        ("DELETE", f"/api/v0/instances/{contract_id}/", {}),
    ]
    assert client.get_instance(contract_id) is None
    assert fake.offers[9001]["rentable"] is True


def test_get_instance_404_is_none(fake: VastFake, client: VastAiMarketplace) -> None:
    fake.fail_next(status=404, body={"success": False, "error": "not_found", "msg": "no such instance"})
    assert client.get_instance("7100999") is None
    [sent] = fake.requests
    assert sent.query == {"owner": ["me"]}


def test_list_follows_next_token_across_pages(fake: VastFake, sleeps: VirtualClock) -> None:
    fake.page_size = 3
    ids = [fake.add_instance(label=f"pool-{i}-00000{i}", machine_id=42000 + i) for i in range(8)]
    with make_client(fake, sleeps) as client:
        instances = client.list_instances()
    assert [i.contract_id for i in instances] == [str(i) for i in ids]
    assert [i.machine_id for i in instances] == [str(42000 + i) for i in range(8)]
    pages = fake.requests_to("GET", "/api/v1/instances/")
    assert len(pages) == 3
    assert "after_token" not in pages[0].query
    assert all("after_token" in p.query for p in pages[1:])
    assert all(p.query["limit"] == ["25"] for p in pages)


def test_list_skips_a_malformed_row(fake: VastFake, client: VastAiMarketplace) -> None:
    good = fake.add_instance(label="ok-0-000001")
    fake.inject(
        Fault(
            "status",
            200,
            {"instances": [{"id": 5, "label": "no machine"}, fake.instances[good].row], "next_token": None},
            method="GET",
        )
    )
    assert [i.contract_id for i in client.list_instances()] == [str(good)]


# --------------------------------------------------------------------------------------------------
# the fake itself (other tests and the infra helper rely on its query semantics)


def test_fake_evaluates_every_operator() -> None:
    offer = make_offer(1, 41001, 501, dph_total=0.4)
    holds: dict[str, dict[str, Any]] = {
        "eq": {"gpu_name": {"eq": "RTX 4090"}},
        "neq": {"gpu_name": {"neq": "RTX 3090"}},
        "gt": {"dph_total": {"gt": 0.39}},
        "gte": {"dph_total": {"gte": 0.4}},
        "lt": {"dph_total": {"lt": 0.41}},
        "lte": {"dph_total": {"lte": 0.4}},
        "in": {"machine_id": {"in": [41001, 41002]}},
        "notin": {"machine_id": {"notin": [41002]}},
    }
    fails: dict[str, dict[str, Any]] = {
        "eq": {"gpu_name": {"eq": "RTX PRO 4000"}},
        "neq": {"gpu_name": {"neq": "RTX 4090"}},
        "gt": {"dph_total": {"gt": 0.4}},
        "gte": {"dph_total": {"gte": 0.41}},
        "lt": {"dph_total": {"lt": 0.4}},
        "lte": {"dph_total": {"lte": 0.39}},
        "in": {"machine_id": {"in": [41002]}},
        "notin": {"machine_id": {"notin": [41001]}},
    }
    assert all(offer_matches(offer, q) for q in holds.values())
    assert not any(offer_matches(offer, q) for q in fails.values())
    assert not offer_matches(offer, {"no_such_field": {"eq": 1}})


def test_fake_rejects_an_unknown_operator(fake: VastFake) -> None:
    reply = httpx.post(
        f"{fake.base_url}/bundles/",
        json={"gpu_name": {"like": "RTX%"}},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert reply.status_code == 400
    assert "unknown operator 'like'" in reply.json()["msg"]
