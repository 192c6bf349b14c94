"""The demo provider for clients that pool several API keys: a quota on some keys only, and
per-key counters in /_stats (playbook.demo, served in process: no socket)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.testclient import TestClient

import playbook as pb
from playbook.demo import DemoSettings
from playbook.demo.counters import KEY_FIELDS, Counters, key_label

KEY_A, KEY_B = "key-a", "key-b"
UNKNOWN = "sk-wrong-9999"
DAY = 86400


@pytest.fixture
def http(demo: pb.demo.DemoServer) -> Iterator[httpx.Client]:
    """A client without a key of its own: each request says which bearer it sends."""
    with TestClient(demo.app, base_url=demo.url) as client:  # served in process: no socket
        yield client


def _company(http: httpx.Client, key: str | None) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return http.get("/v1/company", params={"domain": "acme-robotics.com"}, headers=headers)


def _chat(http: httpx.Client, key: str) -> httpx.Response:
    body = {"model": "demo-mini", "messages": [{"role": "user", "content": "Hello there"}]}
    return http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def _tally(seen: list[tuple[str | None, httpx.Response]]) -> dict[str, dict[str, int]]:
    """What the client saw, counted per key label the way `by_key` counts it."""
    out: dict[str, dict[str, int]] = {}
    for key, response in seen:
        row = out.setdefault(key_label(key), dict.fromkeys(KEY_FIELDS, 0))
        row["requests"] += 1
        status = response.status_code
        if status == 401:
            row["rejected"] += 1
            continue
        error = response.json().get("error") if status == 429 else None
        if error == "daily quota exceeded":
            row["quota_exceeded"] += 1
            continue
        if error in ("rate limited", "too many concurrent requests"):
            row["rate_limited"] += 1
            continue
        row["admitted"] += 1  # past every /v1 limit; a chat 429 comes after
        row["ok"] += status == 200
        row["rate_limited"] += status == 429
    return out


def test_a_quota_on_one_key_refuses_it_while_the_other_key_keeps_answering(
    demo: pb.demo.DemoServer, http: httpx.Client
) -> None:
    """With quota_keys=(A,), A gets 429 "daily quota exceeded" with Retry-After after `quota` requests; B is never counted."""
    demo.reset(api_keys=(KEY_A, KEY_B), quota=3, quota_keys=(KEY_A,), quota_reset=DAY)
    a = [_company(http, KEY_A) for _ in range(4)]
    b = [_company(http, KEY_B) for _ in range(8)]
    assert [r.status_code for r in a] == [200, 200, 200, 429]
    assert a[3].json() == {"error": "daily quota exceeded"}
    assert DAY - 1 <= int(a[3].headers["Retry-After"]) <= DAY
    assert [r.headers["X-RateLimit-Remaining"] for r in a] == ["2", "1", "0", "0"]
    assert [r.status_code for r in b] == [200] * 8
    assert not [
        r for r in b if "X-RateLimit-Limit" in r.headers
    ]  # B is outside the quota: not even told of it
    stats = demo.stats()
    assert stats["quota_exceeded"] == 1
    assert stats["by_key"]["…ey-a"]["quota_exceeded"] == 1 and stats["by_key"]["…ey-b"]["quota_exceeded"] == 0


def test_quota_keys_travel_over_the_admin_endpoints_and_are_shown_as_a_count(
    demo: pb.demo.DemoServer, http: httpx.Client
) -> None:
    """POST /_reset and /_configure take quota_keys as a JSON list; /_settings shows how many, never which."""
    answer = http.post("/_reset", json={"api_keys": [KEY_A, KEY_B], "quota": 1, "quota_keys": [KEY_B]})
    assert answer.status_code == 200 and answer.json()["settings"]["quota_keys"] == 1
    assert demo.settings.quota_keys == (KEY_B,)
    assert [_company(http, KEY_B).status_code for _ in range(2)] == [200, 429]
    assert [_company(http, KEY_A).status_code for _ in range(2)] == [200, 200]
    assert http.post("/_configure", json={"quota_keys": None}).status_code == 200  # every key again
    assert [_company(http, KEY_A).status_code for _ in range(2)] == [
        200,
        429,
    ]  # A's requests were not counted while it was out
    shown = http.get("/_settings").json()
    assert shown["quota_keys"] is None and shown["api_keys"] == 2
    refused = http.post("/_configure", json={"quota_keys": ["key-a", ""]})
    assert refused.status_code == 422 and "quota_keys" in refused.json()["error"]
    assert http.post("/_configure", json={"quota_keys": [KEY_A]}).json()["settings"]["quota_keys"] == 1
    assert KEY_A not in http.get("/_settings").text


def test_by_key_counts_what_each_key_saw_including_a_revoked_key(
    demo: pb.demo.DemoServer, http: httpx.Client
) -> None:
    """/_stats by_key counts requests, admitted, 200s, rate-limit and quota 429s and 401s per key label, never the key."""
    # A bucket refilling once in 1000 s: three requests per key pass, the rest are rate limited.
    demo.reset(api_keys=(KEY_A, KEY_B), rps=0.001, burst=3, quota=2, quota_keys=(KEY_B,), quota_reset=DAY)
    seen: list[tuple[str | None, httpx.Response]] = []
    for key, n in ((KEY_A, 5), (KEY_B, 3), (None, 1), (UNKNOWN, 1)):
        seen += [(key, _company(http, key)) for _ in range(n)]
    demo.configure(api_keys=(KEY_B,))  # A is revoked mid-run
    seen += [(KEY_A, _company(http, KEY_A)) for _ in range(2)]
    assert [r.status_code for _, r in seen] == [200, 200, 200, 429, 429, 200, 200, 429, 401, 401, 401, 401]
    stats = demo.stats()
    assert stats["by_key"] == _tally(seen)
    assert stats["by_key"] == {
        "none": {
            "requests": 1,
            "admitted": 0,
            "ok": 0,
            "rate_limited": 0,
            "quota_exceeded": 0,
            "rejected": 1,
        },
        "…9999": {
            "requests": 1,
            "admitted": 0,
            "ok": 0,
            "rate_limited": 0,
            "quota_exceeded": 0,
            "rejected": 1,
        },
        "…ey-a": {
            "requests": 7,
            "admitted": 3,
            "ok": 3,
            "rate_limited": 2,
            "quota_exceeded": 0,
            "rejected": 2,
        },
        "…ey-b": {
            "requests": 3,
            "admitted": 2,
            "ok": 2,
            "rate_limited": 0,
            "quota_exceeded": 1,
            "rejected": 0,
        },
    }
    assert sum(row["requests"] for row in stats["by_key"].values()) == stats["requests"] == len(seen)
    text = json.dumps(stats, ensure_ascii=False)
    assert KEY_A not in text and KEY_B not in text and UNKNOWN not in text
    demo.reset()
    assert demo.stats()["by_key"] == {}


def test_a_chat_429_under_chat_rpm_counts_as_rate_limited_for_its_key(
    demo: pb.demo.DemoServer, http: httpx.Client
) -> None:
    """The chat endpoint's per-minute refusals count as rate_limited under the key that was refused."""
    demo.reset(api_keys=(KEY_A, KEY_B), chat_rpm=1)  # one request, then one more a minute later
    seen: list[tuple[str | None, httpx.Response]] = [(KEY_A, _chat(http, KEY_A)) for _ in range(3)]
    seen.append((KEY_B, _chat(http, KEY_B)))
    assert [r.status_code for _, r in seen] == [200, 429, 429, 200]
    by_key = demo.stats()["by_key"]
    assert by_key == _tally(seen)
    assert by_key["…ey-a"] == {
        "requests": 3,
        "admitted": 3,
        "ok": 1,
        "rate_limited": 2,
        "quota_exceeded": 0,
        "rejected": 0,
    }
    assert by_key["…ey-b"]["ok"] == 1 and by_key["…ey-b"]["rate_limited"] == 0


def test_key_labels_show_at_most_four_characters_and_never_a_whole_key() -> None:
    """A label is "…" and the key's last four characters, fewer for a short key; "none" without one."""
    assert [key_label(k) for k in (None, "key-a", "sk-live-123456", "abcd", "a")] == [
        "none",
        "…ey-a",
        "…3456",
        "…bcd",
        "…",
    ]


def test_the_most_admitted_in_a_second_is_counted_on_the_providers_clock_whatever_the_pauses() -> None:
    """admitted_most_in_a_second: the most requests let in within any one second, so a client's
    pause between two busy stretches does not lower it, as it lowers admitted over admitted_seconds."""
    counters = Counters()
    for now in (0.0, 0.1, 0.2, 0.95, 10.0, 10.5, 10.6, 10.7, 11.0, 11.6):  # a pause of 9 s between
        counters.admit(now, "…ey-a")
    stats = counters.snapshot()
    # 10.5, 10.6, 10.7 and 11.0 are within a second; 10.0 is a second before 11.0, not within it.
    assert stats["admitted_most_in_a_second"] == 4 and stats["admitted"] == 10
    assert stats["admitted"] / stats["admitted_seconds"] < 1


@pytest.mark.parametrize("bad", [(), [""], ("key-a", 3), 42, {"key-a": 1}])
def test_bad_quota_keys_raise_a_value_error_naming_the_setting(bad: object) -> None:
    """quota_keys must be None or a non-empty tuple (or list) of non-empty strings."""
    with pytest.raises(ValueError, match="quota_keys"):
        DemoSettings(quota_keys=bad)  # type: ignore[arg-type]


def test_quota_keys_accept_a_list_or_one_string_and_default_to_every_key() -> None:
    """A list becomes a tuple, a bare string one key; None (the default) means every key."""
    assert DemoSettings().quota_keys is None
    assert DemoSettings(quota_keys=["key-a", "key-b"]).quota_keys == ("key-a", "key-b")  # type: ignore[arg-type]
    assert DemoSettings(quota_keys="key-a").quota_keys == ("key-a",)  # type: ignore[arg-type]
    assert DemoSettings(quota_keys=("key-a",)).public()["quota_keys"] == 1
