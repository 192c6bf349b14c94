"""The provider governor against the demo provider: quotas and holds, 429s in every header form,
5xx bursts, malformed bodies, bad credentials, permanent 4xx and pacing.

The provider is served in process (the ``demo`` fixture), on the clock of the loop that calls it:
a scenario whose behaviour is its timing (pacing, holds, backoff) runs in virtual time
(``run_virtual``) and asserts the times the governor chose; the others run as a user's ``map()``.
A provider that is not there at all needs a port nobody listens on: that test is on loopback.
"""

from __future__ import annotations

import asyncio
import time

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.events import ProviderDown, ProviderHoldSet, RateChanged
from playbook.providers.limits import Backoff
from playbook.providers.provider import governor


def _email_tool(
    server: pb.demo.DemoServer, provider: pb.Provider, name: str = "acme.email", **over
) -> pb.Tool:
    return pb.demo.email_tool(server, provider=provider, name=name, **over)


def _leads(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"domain": [f"company{i}.com" for i in range(n)], "first": [f"Person{i}" for i in range(n)]},
        index=[f"lead-{i}" for i in range(n)],
    )


def _statuses(server: pb.demo.DemoServer) -> dict[str, int]:
    return server.stats()["by_status"]


# -- quotas: a long hold falls through a waterfall, or parks the row ------------------------------


def test_waterfall_falls_past_an_exhausted_quota_without_waiting(demo, store) -> None:
    """A provider held for an hour by its quota is 'unavailable' to a waterfall: the next leg answers at once."""
    demo.reset(quota=10, quota_reset=3600, miss_rate=0.0)
    a, b = pb.Provider("A"), pb.Provider("B")
    with pb.demo.serve(in_process=True, miss_rate=0.0) as second:
        a_email = _email_tool(demo, a, "a.email")
        b_email = _email_tool(second, b, "b.email")

        @pb.play
        async def find(row, ctx):
            email, source = await ctx.waterfall(
                "email",
                [
                    ctx.leg(a_email, domain=row.domain, first=row.first),
                    ctx.leg(b_email, domain=row.domain, first=row.first),
                ],
                with_source=True,
            )
            return {"email": email, "source": source}

        frame = _leads(30)
        started = time.monotonic()
        run = frame.play.run(find, store=store, progress=False, concurrency=4)
        elapsed = time.monotonic() - started
        out = run.result
        b_stats = second.stats()

    assert elapsed < 10, (
        f"the waterfall waited on the held provider ({elapsed:.1f}s; max_wait is {a.max_wait:g}s)"
    )
    assert out["play_status"].tolist() == ["ok"] * 30
    assert out["email"].notna().all()
    assert (out["source"] == "a.email").sum() == 10  # the quota
    assert (out["source"] == "b.email").sum() == 20
    assert out["source"].iloc[-1] == "b.email"  # later rows are answered by B
    assert _statuses(demo)["200"] == 10 and _statuses(demo)["429"] >= 1
    assert demo.stats()["requests"] <= 10 + 4  # after the hold, A is not asked again
    assert b_stats["by_status"] == {"200": 20}
    legs = run.waterfalls.set_index("tool")
    assert legs.loc["a.email", ["hits", "misses", "unavailable", "errors", "never_reached"]].tolist() == [
        10,
        0,
        20,
        0,
        0,
    ]
    assert legs.loc["b.email", ["hits", "misses", "unavailable", "errors", "never_reached"]].tolist() == [
        20,
        0,
        0,
        0,
        10,
    ]


def test_rows_held_past_max_wait_park_and_the_run_finishes(demo, store) -> None:
    """Rows that meet an hour-long quota hold park (reason 'hold'); run.waiting_on and run.parked say who and until when."""
    demo.reset(quota=10, quota_reset=3600, miss_rate=0.0)
    a = pb.Provider("A")
    a_email = _email_tool(demo, a, "a.email")

    started = time.monotonic()
    run = _leads(30).play.run(a_email, store=store, progress=False, concurrency=4)
    elapsed = time.monotonic() - started
    now = time.time()
    out = run.result

    assert elapsed < 5
    assert (out["play_status"] == "ok").sum() == 10
    assert (out["play_status"] == "parked").sum() == 20
    assert demo.stats()["requests"] <= 10 + 4
    parked = run.parked
    assert len(parked) == 20
    assert set(parked["reason"]) == {"hold"} and set(parked["provider"]) == {"A"}
    ready = parked["ready_at"].map(pd.Timestamp.timestamp)
    assert ready.between(now + 3600 - 30, now + 3600 + 5).all()
    assert parked["message"].str.contains("'A'").all()
    [hold] = run.waiting_on
    assert hold.provider == "A" and hold.last_status == 429
    assert hold.until is not None and now + 3600 - 30 < hold.until < now + 3600 + 5
    assert hold.waiting_rows == hold.parked_rows == 20


# -- 429s in every header form -------------------------------------------------------------------


@pytest.mark.parametrize("retry_after_format", ["http-date", "reset", "none"])
def test_rate_limit_429s_lose_no_row(demo, store, retry_after_format: str) -> None:
    """429s with an HTTP-date, reset headers or no hint all end with every row ok, each paid once."""
    # 16 calls at once against a burst of 10 refilling at 10/s: in virtual time they arrive
    # together, and the holds the refusals ask for pass without waiting.
    demo.reset(rps=10, burst=10, retry_after_format=retry_after_format, miss_rate=0.0)
    provider = pb.Provider("acme")
    events: list = []
    governor(provider).subscribe(events.append)  # a provider of this test only: no need to unsubscribe
    out = run_virtual(
        _leads(40).play.amap(_email_tool(demo, provider), store=store, progress=False, concurrency=16)
    )

    assert len(out) == 40
    assert out["play_status"].tolist() == ["ok"] * 40
    assert out["acme.email"].notna().all()
    statuses = _statuses(demo)
    assert statuses.get("429", 0) > 0, "the scenario did not exercise 429s"
    assert statuses["200"] == 40 and set(statuses) == {"200", "429"}
    assert provider.status().refused == statuses["429"]
    holds = [e for e in events if isinstance(e, ProviderHoldSet)]
    if retry_after_format == "none":
        assert holds == []  # no hint: each call backs off on its own
    else:
        assert holds and {h.status for h in holds} == {429}


# -- 5xx: retried up to `retries`, then ProviderUnavailable ---------------------------------------


def test_503_bursts_are_retried_until_every_row_is_ok(demo, store) -> None:
    """With 30% of requests answered 503, retries=6 brings every row home."""
    # The demo's fault draws are seeded: with seed 1, 20 rows meet 6 faults, never more than two
    # in a row for one call, so the backoff stays short; which rows meet them does not matter.
    demo.reset(fault_rate=0.3, fault_status=503, miss_rate=0.0, seed=1)
    provider = pb.Provider("acme", retries=6)
    out = run_virtual(  # the backoff between tries passes in virtual time
        _leads(20).play.amap(_email_tool(demo, provider), store=store, progress=False, concurrency=16)
    )

    assert out["play_status"].tolist() == ["ok"] * 20
    assert out["acme.email"].notna().all()
    statuses = _statuses(demo)
    assert statuses.get("503", 0) > 0 and statuses["200"] == 20
    assert provider.status().failed == statuses["503"]


def test_503_with_retry_after_retries_that_call_without_holding_the_provider(demo, store) -> None:
    """A 503 with Retry-After is a failure of that call: retried after its hint; the provider is
    neither held nor slowed (DESIGN §3)."""
    demo.reset(fault_rate=0.3, fault_retry_after=1, miss_rate=0.0, seed=9)
    provider = pb.Provider("acme", rps=20, retries=6)
    events: list = []
    governor(provider).subscribe(events.append)  # a provider of this test only: no need to unsubscribe
    out = run_virtual(  # the hints' seconds pass in virtual time
        _leads(5).play.amap(_email_tool(demo, provider), store=store, progress=False, concurrency=5)
    )

    assert out["play_status"].tolist() == ["ok"] * 5
    assert _statuses(demo).get("503", 0) >= 1
    assert not [e for e in events if isinstance(e, ProviderHoldSet)]
    assert all(e.rate >= 20 * 0.98 for e in events if isinstance(e, RateChanged))


def test_provider_that_keeps_failing_goes_down_and_its_rows_park(demo, store) -> None:
    """A provider answering 503 to everything is *down* after a few failures: the rows still
    waiting do not each retry alone: one probe call at a time tests it, the others wait for the
    probes within their max_wait (4 s here), then park with reason "down", and run.waiting_on says so."""
    demo.reset(fault_rate=1.0, fault_status=503)
    provider = pb.Provider("acme", retries=1, max_wait=4)
    run = run_virtual(  # the probes' seconds pass in virtual time
        _leads(30).play.arun(_email_tool(demo, provider), store=store, progress=False, concurrency=4)
    )
    statuses = run.result["play_status"]
    assert set(statuses) <= {"failed", "parked"} and (statuses == "parked").sum() >= 20
    for error in run.result.loc[statuses == "failed", "play_error"]:
        assert error.startswith("ProviderUnavailable:") and "provider 'acme'" in error
    assert set(run.parked["reason"]) == {"down"}
    assert "is down" in run.parked["message"].iloc[0] and "503" not in run.parked["reason"].iloc[0]
    assert demo.stats()["requests"] <= 16 + 2  # far from 30 rows x 2 tries: two probes, at 1 s and 3 s
    assert provider.status().down and [h.reason for h in run.waiting_on] == ["down"]


# -- malformed bodies are permanent --------------------------------------------------------------


def test_malformed_json_fails_only_its_rows_and_is_not_retried(demo, store) -> None:
    """A 200 with a truncated JSON body fails that row naming the tool; other rows are ok; no retry."""
    demo.reset(malformed_rate=0.3, miss_rate=0.0)
    provider = pb.Provider("acme", retries=4)
    out = _leads(20).play.map(_email_tool(demo, provider), store=store, progress=False, concurrency=8)

    failed = out[out["play_status"] == "failed"]
    ok = out[out["play_status"] == "ok"]
    assert len(failed) + len(ok) == 20
    assert 0 < len(failed) < 20
    assert ok["acme.email"].notna().all()
    for error in failed["play_error"]:
        assert "malformed JSON" in error and "'acme.email'" in error
    assert demo.stats()["requests"] == 20  # one request per row: nothing retried
    assert provider.status().failed == 0


# -- 401: the run stops ---------------------------------------------------------------------------


def test_refused_credentials_stop_the_run_without_leaking_the_secret(demo, store, monkeypatch) -> None:
    """A 401 raises RunFatal naming the provider and status; at most `concurrency` requests; no secret shown."""
    value = "s3cr3t-value"
    monkeypatch.delenv("PLAYBOOK_TEST_GOVERNOR_KEY", raising=False)
    provider = pb.Provider("acme")
    tool = _email_tool(
        demo,
        provider,
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret("PLAYBOOK_TEST_GOVERNOR_KEY", default=value),
    )
    assert value not in demo.settings.api_keys

    started = time.monotonic()
    with pytest.raises(pb.RunFatal) as info:
        _leads(100).play.map(tool, store=store, progress=False, concurrency=8)
    elapsed = time.monotonic() - started

    fatal = info.value
    assert fatal.provider == "acme" and fatal.status == 401
    message = str(fatal)
    assert "'acme'" in message and "401" in message and value not in message
    assert value not in "\n".join(fatal._render_traceback_())
    assert elapsed < 5
    stats = demo.stats()
    assert 1 <= stats["requests"] <= 8
    assert stats["by_status"] == {"401": stats["requests"]}
    out = pb.last_run().result
    assert set(out["play_status"]) <= {"failed", "skipped"}
    assert (out["play_status"] == "skipped").sum() >= 92
    assert not out["play_error"].str.contains(value).any()


# -- permanent 4xx --------------------------------------------------------------------------------


def test_permanent_4xx_is_not_retried(demo, store) -> None:
    """A 422 (missing or invalid domain) fails its row after exactly one request, with what the
    provider said about it."""
    demo.reset(miss_rate=0.0)
    provider = pb.Provider("acme", retries=4)
    frame = pd.DataFrame(
        {
            "domain": ["acme.com", "https://www.acme.com/about", None, "globex.com", "not a domain", None],
            "first": ["Ann", "Bob", "Cy", "Di", "Ed", "Flo"],
        }
    )
    out = frame.play.map(_email_tool(demo, provider), store=store, progress=False, concurrency=6)

    assert out["play_status"].tolist() == ["ok", "failed", "failed", "ok", "failed", "failed"]
    for error in out.loc[out["play_status"] == "failed", "play_error"]:
        assert "tool 'acme.email': HTTP 422" in error
    assert "must be a bare domain" in out.loc[1, "play_error"], out.loc[1, "play_error"]
    assert ": missing query parameter 'domain' (kept as this call's answer" in out.loc[2, "play_error"]
    stats = demo.stats()
    assert stats["requests"] == 6 and stats["by_status"] == {"200": 2, "422": 4}
    assert set(stats["idempotency_keys"].values()) == {1}
    assert provider.status().failed == 0


# -- pacing ---------------------------------------------------------------------------------------


def test_configured_pace_avoids_429s(demo, store) -> None:
    """A provider paced at the server's own limit (20/s, burst 5) gets (almost) no 429s."""
    demo.reset(rps=20, burst=5, miss_rate=0.0)
    provider = pb.Provider("acme", rps=20, burst=5)

    async def paced() -> tuple[pd.DataFrame, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        out = await _leads(60).play.amap(
            _email_tool(demo, provider), store=store, progress=False, concurrency=16
        )
        return out, loop.time() - started

    out, elapsed = run_virtual(paced())  # the pace's seconds pass in virtual time

    assert out["play_status"].tolist() == ["ok"] * 60
    statuses = _statuses(demo)
    assert statuses["200"] == 60
    # A call sent on the pace can reach the server a few milliseconds early on a loaded machine (two
    # requests 51 ms apart arrive 49 ms apart): a few 429s (seen: up to 4 while the suite ran), not
    # the 40 of an unpaced run.
    assert statuses.get("429", 0) <= 6  # <= 10% of 60 calls
    assert elapsed >= (60 - 5) / 20 * 0.9  # the pace, not luck, kept the server happy


# -- nothing listening: the provider is down, its rows wait for its probes, then park -------------


@pytest.mark.network
def test_nothing_listening_settles_every_row_in_moments(store) -> None:
    """An http_tool pointed at a port nobody listens on: the provider goes down after a few
    refused connections and the 300 rows wait for its probes, one call each, within their
    max_wait (2 s here), then settle (parked "down", a few failed) instead of each retrying on its
    own (on loopback: a refused connection needs a port, which a server then takes)."""
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago, and nobody listens on now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = pb.Provider("gone", max_wait=2)
    tool = pb.http_tool(
        "gone.email",
        method="GET",
        url=f"http://127.0.0.1:{port}/v1/email",
        params={"domain": "{domain}", "first": "{first}"},
        headers={"Authorization": "Bearer demo-key"},
        provider=provider,
        pick="email",
        miss_status=(404,),
    )
    started = time.monotonic()
    run = _leads(300).play.run(tool, store=store, progress=False, concurrency=32)
    run.wait()
    # max_wait, and slack for 300 rows on a loaded machine (seen: 3.3 s of it while the rest of the
    # suite ran); rows retrying on their own would each back off for their whole retry budget.
    assert time.monotonic() - started < 2 + 6.0
    statuses = run.result["play_status"].value_counts().to_dict()
    assert set(statuses) <= {"parked", "failed"} and statuses["parked"] >= 250
    assert provider.status().down and "gone" in str(run.waiting_on[0]) and run.waiting_on[0].reason == "down"
    assert set(run.parked["reason"]) == {"down"}
    assert provider.status().down_error.startswith(
        "could not connect"
    )  # the provider's failure, not one tool's
    message = run.parked["message"].iloc[0]
    assert message.count("gone.email") == 1 and "is down (could not connect" in message, message

    # The server comes up on that port: run.retry() (the same Provider, as in a notebook) probes
    # it at once, and the rows that met the probe waited for its word instead of parking again.
    with pb.demo.serve(port=port) as server:
        run.retry()  # parked and failed rows alike
        assert set(run.result["play_status"]) == {"ok"}, run.result["play_status"].value_counts().to_dict()
        assert not provider.status().down and run.waiting_on == []
        assert server.stats()["requests"] == 300


def _status_tool(server: pb.demo.DemoServer, provider: pb.Provider) -> pb.Tool:
    """GET /v1/status/{code}: the demo answers the status the row asks for."""
    return pb.http_tool(
        "acme.status",
        provider=provider,
        method="GET",
        url=server.url + "/v1/status/{code}",
        params={"i": "{i}"},
        headers={"Authorization": "Bearer {secret}"},
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
    )


@pytest.mark.slow  # run.retry() blocks, so its tries back off in real seconds
def test_retrying_rows_whose_requests_fail_on_their_own_fails_them_quickly(demo, store) -> None:
    """Rows whose path always answers 503 fail on their own; run.retry() sends them alone, and
    they fail on their own again from their first failure (the provider remembers them): quickly,
    none parked, and the provider never goes down."""
    provider = pb.Provider("acme", rps=40, retries=2)
    governor(provider).backoff = Backoff(base=0.05)  # short tries: the test is about what they count for
    tool = _status_tool(demo, provider)

    @pb.play
    async def get(row, ctx):
        return {"r": await ctx.tool(tool, code=row.code, i=row.i)}

    frame = pd.DataFrame({"code": [503 if i % 10 == 0 else 200 for i in range(60)], "i": range(60)})
    run = frame.play.run(get, store=store, progress=False)
    run.wait()
    failing = ["failed" if i % 10 == 0 else "ok" for i in range(60)]
    assert run.result["play_status"].tolist() == failing
    events: list = []
    governor(provider).subscribe(events.append)
    started = time.monotonic()
    again = run.retry()
    again.wait()
    took = time.monotonic() - started
    assert again.result["play_status"].tolist() == failing and len(again.parked) == 0
    errors = again.result.loc[again.result["play_status"] == "failed", "play_error"]
    assert all("this request fails on its own (provider 'acme' answers other calls)" in e for e in errors)
    assert all(e.endswith("(gave up after 3 tries)") for e in errors)
    assert not [e for e in events if isinstance(e, ProviderDown)] and not provider.status().down
    assert took < 5.0, took
