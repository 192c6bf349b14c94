"""Behaviour of the demo provider (playbook.demo).

Its answers, limits and counters are asked of the app served in process (``serve(in_process=True)``,
through Starlette's ``TestClient``: no socket); what only a server on a socket does (restarts that
close the port, the command line, two processes racing for a port) is asked of one on loopback,
and those tests are marked ``network``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient
from vtime import FrozenClock

from playbook import demo
from playbook.demo import DEMO_KEY, DemoSettings

AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
ROOT = Path(__file__).resolve().parents[1]


CLOCK = FrozenClock(1000.0)


@pytest.fixture(scope="module")
def server():
    with demo.serve(clock=CLOCK, in_process=True) as running:
        yield running


@pytest.fixture
def provider(server):
    server.reset()
    return server


def _http(provider, **options):
    """A client of the provider served in process (no socket)."""
    return TestClient(provider.app, base_url=provider.url, **options)


@pytest.fixture
def client(provider):
    with _http(provider, headers=AUTH) as http:
        yield http


def _email(client, domain="acme-robotics.com", first="Camille", last=None, **headers):
    params = {"domain": domain, "first": first}
    if last is not None:
        params["last"] = last
    return client.get("/v1/email", params=params, headers=headers)


def _find_miss(client, domain="acme-robotics.com"):
    for i in range(200):
        first = f"person{i}"
        if _email(client, domain, first).status_code == 404:
            return first
    raise AssertionError("no miss in 200 names at miss_rate=0.2")


# -- auth ---------------------------------------------------------------------------------------


def test_missing_or_wrong_key_is_401_without_echoing_it(provider):
    """Requests without a valid bearer key get 401 {"error": "invalid api key"}, key not echoed."""
    query = {"domain": "acme.com", "first": "a"}
    with _http(provider) as http:
        responses = [
            http.get("/v1/email", params=query),
            http.get("/v1/email", params=query, headers={"Authorization": "Bearer sk-wrong-123"}),
            http.get("/v1/email", params=query, headers={"Authorization": f"Basic {DEMO_KEY}"}),
        ]
    assert [r.status_code for r in responses] == [401, 401, 401]
    assert all(r.json() == {"error": "invalid api key"} for r in responses)
    assert "sk-wrong-123" not in responses[1].text
    assert provider.stats()["by_auth"] == {"ok": 0, "rejected": 3}


# -- email, company, bulk -----------------------------------------------------------------------


def test_email_answer_is_deterministic(client):
    """The same domain and person always get the same email, confidence and source."""
    first = _email(client, "acme-robotics.com", "Camille", "Becker")
    second = _email(client, "ACME-robotics.com", "Camille", "Becker")
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    body = first.json()
    assert body["email"].endswith("@acme-robotics.com") and body["source"] == "demo"
    assert 0.0 < body["confidence"] < 1.0


def test_email_miss_is_a_stable_404(client):
    """A miss is a 404 {"error": "not found"} decided by domain + first, not by chance."""
    first = _find_miss(client)
    again = _email(client, first=first)
    with_last = _email(client, first=first, last="Anyone")
    assert again.status_code == with_last.status_code == 404
    assert again.json() == {"error": "not found"}


def test_miss_rate_setting_controls_misses(provider, client):
    """miss_rate=0 finds everyone and miss_rate=1 finds no one."""
    provider.reset(miss_rate=0.0)
    assert {_email(client, first=f"p{i}").status_code for i in range(30)} == {200}
    provider.reset(miss_rate=1.0)
    assert {_email(client, first=f"p{i}").status_code for i in range(30)} == {404}


def test_bad_email_parameters_are_422_naming_them(client):
    """A missing parameter or a URL instead of a domain is a 422 that names the parameter."""
    missing = client.get("/v1/email", params={"first": "Ann"})
    url = _email(client, domain="https://www.acme.com/about")
    no_first = client.get("/v1/email", params={"domain": "acme.com"})
    assert (missing.status_code, url.status_code, no_first.status_code) == (422, 422, 422)
    assert "domain" in missing.json()["error"] and "domain" in url.json()["error"]
    assert "first" in no_first.json()["error"]


def test_company_profile_is_deterministic(client):
    """/v1/company answers a full, stable profile; sample domains keep their lead's name."""
    one = client.get("/v1/company", params={"domain": "www.acme-robotics.com"})
    two = client.get("/v1/company", params={"domain": "acme-robotics.com"})
    assert one.status_code == 200 and one.json() == two.json()
    profile = one.json()
    assert set(profile) == {"domain", "name", "industry", "employees", "country", "founded"}
    assert profile["name"] == "Acme Robotics" and profile["industry"] == "Robotics"
    assert client.get("/v1/company").status_code == 422


def test_bulk_keeps_order_and_nulls_misses(provider, client):
    """Bulk results line up with the items; misses are null; it is one request of n items."""
    miss = _find_miss(client)
    provider.reset()
    items = [
        {"domain": "acme-robotics.com", "first": "Camille", "last": "Becker"},
        {"domain": "acme-robotics.com", "first": miss},
        {"domain": "bluefin-analytics.io", "first": "Ann", "last": "Lee"},
    ]
    response = client.post("/v1/email/bulk", json={"items": items})
    assert response.status_code == 200
    results = response.json()["results"]
    singles = [_email(client, i["domain"], i["first"], i.get("last")) for i in items]
    assert results == [s.json() if s.status_code == 200 else None for s in singles]
    assert results[1] is None
    stats = provider.stats()
    assert stats["by_endpoint"]["POST /v1/email/bulk"] == 1 and stats["bulk_items"] == 3


def test_bulk_rejects_more_than_100_items(client):
    """More than 100 bulk items is a 422."""
    items = [{"domain": "acme.com", "first": f"p{i}"} for i in range(101)]
    response = client.post("/v1/email/bulk", json={"items": items})
    assert response.status_code == 422 and "100" in response.json()["error"]


def test_unknown_endpoint_and_wrong_method(client):
    """An unknown /v1 path is a JSON 404; a known path with the wrong method is a 405."""
    assert client.get("/v1/nothing-here").status_code == 404
    assert client.post("/v1/email").status_code == 405


def test_status_path_answers_the_status_it_names(provider, client):
    """GET /v1/status/{code} answers that status, as httpbin's /status/{code} (an input that
    always gets a 503 while others are answered), asking for no key (as httpbin's: a tool whose
    host comes from the row sends none) but behind the limits; other codes are 422."""
    assert client.get("/v1/status/503", params={"row": 7}).status_code == 503
    assert client.get("/v1/status/503").json() == {"error": "status 503, as the path asked"}
    assert client.get("/v1/status/200").json() == {"status": 200}
    assert client.get("/v1/status/204").status_code == 204
    assert client.get("/v1/status/x").status_code == 422 and client.get("/v1/status/99").status_code == 422
    with _http(provider) as anonymous:
        assert (
            anonymous.get("/v1/status/503").status_code == 503
            and anonymous.get("/v1/status/200").status_code == 200
        )
    assert (
        client.get("/v1/email", headers={"Authorization": "Bearer nope"}).status_code == 401
    )  # the others still ask
    assert provider.stats()["by_key"]["public"]["requests"] == 2
    assert client.post("/v1/status/503").status_code == 405
    provider.reset(fault_every=1)
    assert (
        client.get("/v1/status/200").status_code == 503
    )  # faults and limits apply first, as everywhere under /v1


# -- rate limits and quotas ---------------------------------------------------------------------


@pytest.mark.parametrize("retry_format", ["seconds", "http-date", "reset", "none"])
def test_rate_limit_429_carries_the_configured_hint(provider, client, retry_format):
    """Past the burst a key gets 429 "rate limited" with a hint in the configured format."""
    provider.reset(rps=0.5, burst=2, retry_after_format=retry_format)
    statuses = [_email(client).status_code for _ in range(2)]
    limited = _email(client)
    assert statuses == [200, 200] and limited.status_code == 429
    assert limited.json() == {"error": "rate limited"}
    headers = limited.headers
    if retry_format == "seconds":
        assert headers["Retry-After"] == "2"
    elif retry_format == "http-date":
        delta = parsedate_to_datetime(headers["Retry-After"]).timestamp() - time.time()
        assert 0.5 <= delta <= 3.5
    elif retry_format == "reset":
        assert "Retry-After" not in headers and headers["RateLimit-Reset"] == "2"
        assert 0.5 <= int(headers["X-RateLimit-Reset"]) - time.time() <= 3.5
    else:
        assert not {"retry-after", "ratelimit-reset", "x-ratelimit-reset"} & set(headers)
    assert provider.stats()["rate_limited"] == 1


def test_rate_limit_is_per_key_and_refills(provider):
    """Each API key has its own bucket, refilled at rps."""
    provider.reset(api_keys=("key-a", "key-b"), rps=2.0, burst=1)
    with _http(provider) as http:

        def call(key):
            return _email(http, Authorization=f"Bearer {key}").status_code

        assert [call("key-a"), call("key-a"), call("key-b")] == [200, 429, 200]
        CLOCK.now += 0.4
        assert call("key-a") == 429
        CLOCK.now += 0.15
        assert call("key-a") == 200


def test_quota_is_429_after_n_requests(provider, client):
    """Past `quota` counted requests a key gets 429 "daily quota exceeded" with Retry-After."""
    provider.reset(quota=3)
    assert [_email(client).status_code for _ in range(3)] == [200, 200, 200]
    over = _email(client)
    assert over.status_code == 429 and over.json() == {"error": "daily quota exceeded"}
    assert over.headers["Retry-After"] == "3600"
    assert provider.stats()["quota_exceeded"] == 1


def test_quota_answers_say_the_limit_and_what_remains(provider, client):
    """Answers counted against a quota carry X-RateLimit-Limit and X-RateLimit-Remaining; 0 on the 429."""
    provider.reset(quota=2, retry_after_format="reset")
    answers = [_email(client) for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert [r.headers["X-RateLimit-Limit"] for r in answers] == ["2", "2", "2"]
    assert [r.headers["X-RateLimit-Remaining"] for r in answers] == ["1", "0", "0"]
    assert answers[2].headers["RateLimit-Reset"] == "3600"
    provider.reset()
    assert "X-RateLimit-Remaining" not in _email(client).headers


def _next_window(period):
    """Move the frozen clock to the start of a fresh window aligned to `period`; return that start."""
    CLOCK.now = (CLOCK.now // period + 1) * period
    return CLOCK.now


def test_fixed_window_admits_n_per_aligned_window_and_hints_its_end(provider, client):
    """window_limit requests pass per window aligned to window_seconds; the next gets 429 until the window ends."""
    provider.reset(window_limit=2, window_seconds=10)
    start = _next_window(10)
    CLOCK.now = start + 3.5
    assert [_email(client).status_code for _ in range(2)] == [200, 200]
    over = _email(client)
    assert over.status_code == 429 and over.json() == {"error": "rate limited"}
    assert over.headers["Retry-After"] == "7"  # 6.5 s to the window's end, rounded up
    CLOCK.now = start + 9.99
    limited = _email(client)
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "1"
    CLOCK.now = start + 10  # the next window: full again, however busy the last one was
    assert [_email(client).status_code for _ in range(3)] == [200, 200, 429]
    assert provider.stats()["rate_limited"] == 3


def test_fixed_window_and_token_bucket_are_independent_limits(provider, client):
    """With both, a request needs a token and room in its window; either refusing is a 429."""
    provider.reset(rps=1.0, burst=3, window_limit=2, window_seconds=60, retry_after_format="reset")
    _next_window(60)
    assert [_email(client).status_code for _ in range(2)] == [200, 200]
    over = _email(client)  # a token is left; the window is full
    assert over.status_code == 429 and over.headers["RateLimit-Reset"] == "60"
    _next_window(60)
    assert [_email(client).status_code for _ in range(2)] == [200, 200]
    provider.reset(rps=1.0, burst=1, window_limit=5, window_seconds=60)
    assert [_email(client).status_code for _ in range(2)] == [200, 429]  # the bucket refuses first


def test_in_flight_limit_refuses_without_a_hint_per_key(provider):
    """A key with max_in_flight requests unanswered gets 429 "too many concurrent requests" with no hint."""
    provider.reset(api_keys=("key-a", "key-b"), max_in_flight=2, latency=0.5)
    with _http(provider) as http, ThreadPoolExecutor(max_workers=2) as pool:

        def call(key):
            return _email(http, Authorization=f"Bearer {key}")

        pending = [pool.submit(call, "key-a") for _ in range(2)]
        deadline = time.monotonic() + 5
        while provider.stats()["in_flight"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused, other = call("key-a"), call("key-b")
        assert [p.result(timeout=10).status_code for p in pending] == [200, 200]
        after = call("key-a")
    assert refused.status_code == 429 and refused.json() == {"error": "too many concurrent requests"}
    assert not {"retry-after", "ratelimit-reset", "x-ratelimit-reset"} & set(refused.headers)
    assert other.status_code == 200 and after.status_code == 200
    assert provider.stats()["rate_limited"] == 1


def test_fault_every_fails_every_nth_request_past_auth_and_limits(provider, client):
    """fault_every=3 answers the 3rd, 6th, ... request that passed auth and limits with the fault."""
    provider.reset(fault_every=3, fault_retry_after=1, window_limit=4, window_seconds=60, miss_rate=0.0)
    _next_window(60)
    with _http(provider) as anonymous:
        assert _email(anonymous).status_code == 401  # not counted
    first = [_email(client) for _ in range(5)]
    assert [r.status_code for r in first] == [200, 200, 503, 200, 429]  # the 429 is not counted
    assert first[2].headers["Retry-After"] == "1" and first[2].json() == {"error": "service unavailable"}
    _next_window(60)
    assert [_email(client).status_code for _ in range(4)] == [200, 503, 200, 200]
    provider.reset(fault_every=2, fault_status=500)
    assert _statuses(client, 4) == [200, 500, 200, 500]


def test_quota_endpoints_limit_where_the_quota_applies(provider, client):
    """With quota_endpoints, other endpoints are not counted against the quota."""
    provider.reset(quota=1, quota_endpoints=("/v1/company",))
    assert [_email(client).status_code for _ in range(3)] == [200, 200, 200]
    company = [client.get("/v1/company", params={"domain": "acme.com"}).status_code for _ in range(2)]
    assert company == [200, 429]


# -- faults, latency, malformed bodies ----------------------------------------------------------


def _statuses(client, n=40):
    return [_email(client).status_code for _ in range(n)]


def test_fault_rate_is_deterministic_given_the_seed(provider, client):
    """fault_rate injects 503s whose positions repeat exactly for the same seed."""
    provider.reset(fault_rate=0.3, seed=7)
    first = _statuses(client)
    provider.reset(fault_rate=0.3, seed=7)
    assert _statuses(client) == first
    assert 0 < first.count(503) < 40 and set(first) == {200, 503}
    provider.reset(fault_rate=0.3, seed=8)
    assert _statuses(client) != first


def test_fault_status_and_retry_hint(provider, client):
    """fault_status=500 changes the injected status; fault_retry_after adds a hint."""
    provider.reset(fault_rate=1.0, fault_status=500)
    assert _email(client).status_code == 500
    provider.reset(fault_rate=1.0, fault_retry_after=3)
    faulted = _email(client)
    assert faulted.status_code == 503 and faulted.headers["Retry-After"] == "3"


def test_latency_and_slow_requests_delay_responses(provider, client):
    """latency delays every /v1 response; slow_rate=1 adds slow_latency on top."""
    provider.reset(latency=0.1)
    started = time.perf_counter()
    _email(client)
    assert time.perf_counter() - started >= 0.1
    provider.reset(slow_rate=1.0, slow_latency=0.15)
    started = time.perf_counter()
    _email(client)
    assert time.perf_counter() - started >= 0.15


def test_malformed_rate_breaks_200_bodies(provider, client):
    """malformed_rate=1 makes 200 responses carry a body that is not JSON."""
    provider.reset(malformed_rate=1.0, miss_rate=0.0)
    response = _email(client)
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.text)


# -- jobs and chat ------------------------------------------------------------------------------


def test_job_runs_then_is_done_after_job_seconds(provider, client):
    """A submitted job is running until job_seconds pass, then done with its result."""
    provider.reset(job_seconds=0.3)
    submitted = client.post("/v1/jobs", json={"domain": "acme-robotics.com"})
    assert submitted.status_code == 202 and submitted.json()["status"] == "queued"
    job_id = submitted.json()["job_id"]
    assert client.get(f"/v1/jobs/{job_id}").json() == {"job_id": job_id, "status": "running"}
    CLOCK.now += 0.29
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
    CLOCK.now += 0.02
    done = client.get(f"/v1/jobs/{job_id}").json()
    profile = client.get("/v1/company", params={"domain": "acme-robotics.com"}).json()
    assert done == {"job_id": job_id, "status": "done", "result": profile}
    assert client.get("/v1/jobs/job_999999").status_code == 404
    stats = provider.stats()
    assert stats["jobs_submitted"] == 1 and stats["by_endpoint"]["GET /v1/jobs/{job_id}"] == 4


def _chat(client, content, model="demo-mini"):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    return client.post("/v1/chat/completions", json={"model": model, "messages": messages})


def _answer(response):
    return response.json()["choices"][0]["message"]["content"]


def test_chat_completion_has_openai_shape_and_is_deterministic(client):
    """Chat completions answer in OpenAI's shape and the same messages get the same content."""
    prompt = "Summarise: Acme Robotics builds warehouse robots for retailers."
    one, two = _chat(client, prompt), _chat(client, prompt)
    assert one.status_code == 200
    body = one.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "demo-mini" and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant" and "Acme Robotics" in choice["message"]["content"]
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert two.json()["choices"] == body["choices"] and two.json()["id"] == body["id"]


def test_chat_classify_answers_an_industry_label(client):
    """A "Classify" prompt naming a company gets an industry label, one of those offered."""
    assert _answer(_chat(client, "Classify the industry of Acme Robotics.")) == "Robotics"
    assert _answer(_chat(client, "Classify into Retail, Energy or Software: Sunny Solar Ltd")) == "Energy"
    assert _answer(_chat(client, "Classify into Retail or Energy: Acme Robotics")) in {"Retail", "Energy"}


def test_chat_bad_body_is_400_in_openai_style(client):
    """A bad chat body gets 400 with {"error": {"message", "type": "invalid_request_error"}}."""
    for body in ({"messages": [{"role": "user", "content": "hi"}]}, {"model": "m", "messages": []}):
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert client.post("/v1/chat/completions", content=b"{not json").status_code == 400


# -- counters, reset, admin ---------------------------------------------------------------------


def test_counters_by_endpoint_status_auth_and_idempotency_key(provider, client):
    """stats() counts requests per endpoint template, status, auth and Idempotency-Key."""
    miss = _find_miss(client)
    provider.reset()
    _email(client, **{"Idempotency-Key": "k1"})
    _email(client, **{"Idempotency-Key": "k1"})
    _email(client, first=miss, **{"Idempotency-Key": "k2"})
    client.get("/v1/company", params={"domain": "acme.com"}, headers={"Authorization": "Bearer nope"})
    stats = provider.stats()
    assert stats["requests"] == 4
    assert stats["by_endpoint"] == {"GET /v1/email": 3, "GET /v1/company": 1}
    assert stats["by_status"] == {"200": 2, "401": 1, "404": 1}
    assert stats["by_auth"] == {"ok": 3, "rejected": 1}
    assert stats["idempotency_keys"] == {"k1": 2, "k2": 1}
    assert stats["duplicate_idempotency_keys"] == 1
    assert stats["in_flight"] == 0
    assert client.get("/_stats").json() == json.loads(json.dumps(stats))


def test_reset_zeroes_counters_and_restores_settings(provider, client):
    """reset() zeroes every counter and returns settings to those given to serve()."""
    provider.configure(rps=1000.0, miss_rate=0.0)
    _email(client, **{"Idempotency-Key": "k"})
    client.post("/v1/jobs", json={"x": 1})
    settings = provider.reset()
    stats = provider.stats()
    assert stats["requests"] == 0 and stats["by_endpoint"] == {} and stats["by_status"] == {}
    assert stats["idempotency_keys"] == {} and stats["jobs_submitted"] == 0
    assert settings == provider.settings == DemoSettings()


def test_reset_during_a_request_does_not_count_it_afterwards(provider, client):
    """A request admitted before reset() leaves the fresh counters at zero when it ends."""
    provider.reset(latency=0.3)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_email, client)
        deadline = time.monotonic() + 5
        while provider.stats()["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        provider.reset()
        assert pending.result(timeout=10).status_code == 200
    stats = provider.stats()
    assert stats["in_flight"] == 0 and stats["by_status"] == {} and stats["requests"] == 0


def test_configure_changes_settings_but_keeps_counters(provider, client):
    """configure() changes behaviour at once without zeroing counters."""
    _email(client)
    provider.configure(fault_rate=1.0)
    assert _email(client).status_code == 503
    assert provider.stats()["requests"] == 2 and provider.settings.fault_rate == 1.0


def test_admin_endpoints_steer_the_server_over_http(provider):
    """/_health, /_configure, /_reset and /_stats work over plain HTTP without auth."""
    with _http(provider) as http:
        assert http.get("/_health").json() == {"ok": True}
        configured = http.post("/_configure", json={"fault_rate": 1.0})
        assert configured.status_code == 200 and configured.json()["settings"]["fault_rate"] == 1.0
        assert "demo-key" not in configured.text
        assert http.get("/v1/company", params={"domain": "acme.com"}, headers=AUTH).status_code == 503
        bad = http.post("/_configure", json={"fault_rate": 2})
        assert bad.status_code == 422 and "fault_rate" in bad.json()["error"]
        assert http.post("/_configure", json={"nope": 1}).status_code == 422
        assert http.post("/_reset", json={"quota": 5}).json()["settings"]["quota"] == 5
        assert http.get("/_stats").json()["requests"] == 0
        assert http.post("/_reset").status_code == 200


# -- restarts ----------------------------------------------------------------------------------


def _until_up(url, deadline):
    while True:
        try:
            return httpx.get(
                url + "/v1/email", params={"domain": "acme.com", "first": "a"}, headers=AUTH, timeout=5
            )
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@pytest.mark.network
def test_restart_closes_the_port_then_serves_the_same_state():
    """restart(down) refuses connections for `down` seconds; then the same port serves, counters
    kept, buckets full (on loopback: a refused connection needs a port that closes)."""
    with demo.serve(port=0, clock=FrozenClock(), rps=1.0, burst=1) as running:
        url = running.url
        with httpx.Client(base_url=url, headers=AUTH, timeout=5) as http:
            first = [_email(http).status_code for _ in range(2)]
        started = time.monotonic()
        running.restart(0.5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/_health", timeout=5)
        assert running.running
        back = _until_up(url, started + 5)
        assert time.monotonic() - started >= 0.5
        assert running.url == url and running.stats()["requests"] == 3
    assert (
        first == [200, 429] and back.status_code == 200
    )  # the frozen clock never refilled it: the restart did


@pytest.mark.network
def test_admin_restart_over_http_and_its_validation():
    """POST /_restart {"down": s} answers, then closes the port for s seconds; a bad down is a 422
    naming it (on loopback: only a server with a port can close it)."""
    with demo.serve(port=0) as running, httpx.Client(base_url=running.url, timeout=5) as http:
        bad = [http.post("/_restart", json={"down": -1}), http.post("/_restart", json={"dwn": 1})]
        assert [r.status_code for r in bad] == [422, 422]
        assert "down" in bad[0].json()["error"] and "dwn" in bad[1].json()["error"]
        started = time.monotonic()
        answer = http.post("/_restart", json={"down": 0.5})
        assert answer.status_code == 200 and answer.json() == {"ok": True, "down": 0.5}
        refused = False
        while not refused and time.monotonic() < started + 0.4:
            try:
                httpx.get(running.url + "/_health", timeout=5)
            except httpx.ConnectError:
                refused = True
        assert refused, "the port still answered after POST /_restart"
        assert _until_up(running.url, started + 5).status_code == 200
        assert time.monotonic() - started >= 0.5


@pytest.mark.network
def test_stop_during_a_restart_ends_the_server_at_once():
    """stop() while the port is closed for a restart ends the thread without waiting the restart
    out (on loopback: the server's thread and port are what stop() ends)."""
    running = demo.serve(port=0)
    running.restart(30)
    started = time.monotonic()
    running.stop()
    assert not running.running and time.monotonic() - started < 3


# -- settings, lifecycle, CLI, data -------------------------------------------------------------


def test_settings_are_validated_with_the_setting_named():
    """Bad values raise ValueError naming the setting; unknown names raise TypeError."""
    for bad, name in (
        ({"rps": 0}, "rps"),
        ({"fault_rate": 1.5}, "fault_rate"),
        ({"burst": 0}, "burst"),
        ({"retry_after_format": "minutes"}, "retry_after_format"),
        ({"api_keys": ()}, "api_keys"),
        ({"window_limit": 0}, "window_limit"),
        ({"window_seconds": 0}, "window_seconds"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"fault_every": 0}, "fault_every"),
        ({"fault_every": 2.5}, "fault_every"),
    ):
        with pytest.raises(ValueError, match=name):
            DemoSettings(**bad)
    with pytest.raises(TypeError, match="bogus"):
        demo.serve(bogus=1)


def test_serve_without_the_demo_extra_says_what_to_install(monkeypatch):
    """Without uvicorn installed, serve() raises ImportError naming the demo extra."""
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(ImportError, match=r'pip install "playbook-df\[demo\]"'):
        demo.serve()


@pytest.mark.network
def test_server_handle_lifecycle():
    """serve() returns a running handle with url and port; stop() is idempotent (on loopback:
    the port it listens on is the behaviour)."""
    with demo.serve(port=0) as running:
        assert running.url == f"http://127.0.0.1:{running.port}" and running.port > 0
        assert "requests=0" in repr(running) and running.running
    running.stop()
    assert "stopped" in repr(running) and not running.running


@pytest.mark.network
def test_cli_prints_url_serves_and_stops_on_sigterm():
    """`python -m playbook.demo --port 0` prints one URL line, takes its settings as flags, serves,
    and exits 0 on SIGTERM (a socket: the provider is another process)."""
    command = [
        sys.executable,
        "-m",
        "playbook.demo",
        "--port",
        "0",
        "--rps",
        "50",
        "--window-limit",
        "20",
        "--window-seconds",
        "2",
        "--max-in-flight",
        "4",
        "--fault-every",
        "7",
        "--chat-tpm",
        "30000",
        "--batch-seconds",
        "0.5",
    ]
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                assert selector.select(timeout=20), "no URL line within 20 s"
            line = proc.stdout.readline()
            assert line.startswith("playbook demo provider listening on http://127.0.0.1:")
            url = line.rsplit(" ", 1)[1].strip()
            with httpx.Client(base_url=url, timeout=10.0) as http:
                assert http.get("/_health").json() == {"ok": True}
                settings = http.get("/_settings").json()
                assert (
                    settings["rps"] == 50.0
                    and settings["window_limit"] == 20
                    and settings["window_seconds"] == 2.0
                )
                assert settings["max_in_flight"] == 4 and settings["fault_every"] == 7
                assert settings["chat_tpm"] == 30000 and settings["batch_seconds"] == 0.5
            proc.send_signal(signal.SIGTERM)
            rest, _ = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0 and rest == ""


def test_importing_demo_does_not_import_the_server_stack():
    """`import playbook.demo` loads neither starlette nor uvicorn."""
    code = "import sys, playbook.demo; print(sorted(m for m in ('starlette', 'uvicorn') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_leads_dataframe_has_expected_shape():
    """leads() has the six columns, ~300 rows, 3 exact duplicates and ~10 shared websites."""
    df = demo.leads()
    assert list(df.columns) == ["lead_id", "first", "last", "company", "website", "country"]
    assert 280 <= len(df) <= 320 and df["lead_id"].dtype.kind == "i"
    assert df.duplicated().sum() == 3
    assert df.drop_duplicates()["website"].duplicated().sum() == 10
    assert df["website"].str.match(r"(?i)^https?://").all()


_STARTS_AT_ONCE = """
import sys, urllib.request
from playbook import demo
print("ready", flush=True)
sys.stdin.readline()  # both processes go at once
server = demo.serve()
asked = urllib.request.Request(server.url + "/v1/company?domain=a.com", headers={"Authorization": "Bearer demo-key"})
urllib.request.urlopen(asked).read()
print(server.url, server.stats()["requests"], flush=True)
sys.stdin.readline()  # up until the other one has asked too
server.stop()
"""


@pytest.mark.network
def test_two_processes_starting_a_demo_at_once_each_serve_their_own_calls(tmp_path: Path) -> None:
    """Two processes calling serve() at the same instant (two notebooks, two test workers) get a
    port each: one call each, each answered by its own server, not both by whichever listened
    (sockets: the race for a port is the behaviour)."""
    env = {**os.environ, "PLAYBOOK_MARKS": str(tmp_path)}
    for attempt in range(3):
        with contextlib.ExitStack() as stack:
            procs = [
                stack.enter_context(
                    subprocess.Popen(
                        [sys.executable, "-c", _STARTS_AT_ONCE],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                        env=env,
                    )
                )
                for _ in range(2)
            ]
            pipes = [
                (proc.stdin, proc.stdout)
                for proc in procs
                if proc.stdin is not None and proc.stdout is not None
            ]
            assert [out.readline().strip() for _, out in pipes] == ["ready", "ready"]
            for into, _ in pipes:
                into.write("go\n")
                into.flush()
            said = [out.readline().split() for _, out in pipes]
            for proc in procs:
                proc.communicate("bye\n", timeout=30)
        assert len({url for url, _ in said}) == 2, f"attempt {attempt}: both on {said}"
        assert [served for _, served in said] == ["1", "1"], said
