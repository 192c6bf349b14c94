"""The README's second promise: keep going under rate limits.  A hold within ``max_wait`` is waited
out, one past it parks its rows and says who holds them until when, a provider down is held or
passed by a waterfall, and refused credentials stop the run at once.

Each promise is written once and run on every engine: one process, several processes sharing a
Redis store and limiter, and a dask.distributed cluster (``engines``, and the ``engine`` fixture in
``conftest``).  The provider is the demo's, a real HTTP server, whose counters say what was paid.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pandas as pd
import pytest
from engines import Engine
from promises import answered, email, enrich, people, requests

import playbook as pb
from playbook.demo.settings import DEMO_KEY

# -- holds, max_wait and parked rows -----------------------------------------------------------


def test_a_hold_past_max_wait_parks_the_rows_and_says_who_holds_them_until_when(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A daily quota used up (429, Retry-After an hour) past max_wait: the rows that need the
    provider park (reason "hold", ready when the quota resets), the others finish, and the
    run's holds name the provider, until when, and how many rows it holds."""
    demo.reset(quota=10, quota_reset=3600)
    quota = name("quota")
    play = enrich(email(demo, pb.Provider(quota, concurrency=2, max_wait=30)))
    started = time.time()
    out = engine.run(people(30), play, concurrency=4)
    assert (
        out.statuses.get("parked", 0) == 20
        and out.statuses.get("ok", 0) + out.statuses.get("reused", 0) == 10
    )
    assert set(out.parked["reason"]) == {"hold"} and set(out.parked["provider"]) == {quota}
    ready = out.parked["ready_at"].map(lambda t: t.timestamp())
    assert (ready > started + 3000).all() and (ready < time.time() + 3700).all()
    [hold] = [h for h in out.waiting_on if h["provider"] == quota]
    assert hold["reason"] == "hold" and hold["parked_rows"] >= 1 and hold["last_status"] == 429
    assert hold["until"] is not None and hold["until"] > started + 3000


@pytest.mark.slow  # real seconds of holds and waits, on every engine
def test_a_hold_within_max_wait_is_waited_out_and_every_row_finishes(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A quota that resets in 2 s (Retry-After 2) within max_wait: the held rows step aside and
    come back when it ends; every row finishes, none parks, each call paid once."""
    demo.reset(quota=10, quota_reset=2)
    play = enrich(email(demo, pb.Provider(name("quota"), concurrency=2)))
    started = time.monotonic()
    out = engine.run(people(20), play, concurrency=4)
    assert set(out.statuses) <= {"ok", "reused"} and sum(out.statuses.values()) == 20
    assert time.monotonic() - started >= 2.0  # the hold was waited out
    assert answered(demo) == 20 and demo.stats()["duplicate_idempotency_keys"] <= demo.stats()[
        "by_status"
    ].get("429", 0)


@pytest.mark.slow  # real seconds of holds and waits, on every engine
@pytest.mark.parametrize(
    "caught", [Exception, BaseException], ids=["except Exception", "except BaseException"]
)
def test_a_hold_past_max_wait_caught_by_the_play_still_parks_the_row(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str], caught: type[BaseException]
) -> None:
    """A play that catches everything around ctx.tool (to use a fallback) cannot finish a row
    the provider holds past max_wait: the row parks with the hold's reason, no memo is kept,
    and once the hold is over a rerun pays for each such row once, with the real answer.  The
    quota's day is 8 s: the first run must end within it, on a loaded machine too."""
    demo.reset(quota=5, quota_reset=8)
    tool = email(demo, pb.Provider(name("quota"), concurrency=1, max_wait=1))

    async def swallowing(row, ctx):  # type: ignore[no-untyped-def]
        try:
            found = await ctx.tool(tool, domain=row.domain, first=row.first)
        except caught:
            found = "fallback"
        return {"email": found}

    play = pb.play(swallowing, name="swallowing")
    out = engine.run(people(12), play, concurrency=3)
    assert out.statuses.get("parked", 0) == 7 and "fallback" not in set(out.result["email"].dropna())
    assert set(out.parked["reason"]) == {"hold"}
    time.sleep(max(0.0, out.parked["ready_at"].max().timestamp() - time.time()) + 0.2)
    demo.configure(quota=None)
    paid_before = answered(demo)
    # The quota's refusals came after calls got through: the provider learnt a pace from them (how
    # fast those went), which on a loaded machine may space calls over a second apart; waiting for
    # that pace is not what this rerun is about, so its rows may wait it out.
    again = engine.run(people(12), play, concurrency=3, max_wait=60)
    assert (
        again.statuses.get("reused", 0) == 5 and again.statuses.get("ok", 0) == 7
    )  # the parked rows had no memo
    assert answered(demo) - paid_before == 7 and "fallback" not in set(again.result["email"].dropna())


def test_a_play_may_opt_in_to_handle_a_hold_past_max_wait(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """ctx.tool(..., on_exhausted="raise") is the explicit opt-in: the play's except decides, and
    the row finishes with its fallback."""
    demo.reset(quota=0, quota_reset=3600)
    tool = email(demo, pb.Provider(name("quota"), max_wait=30))

    async def fallback(row, ctx):  # type: ignore[no-untyped-def]
        try:
            return {"email": await ctx.tool(tool, domain=row.domain, first=row.first, on_exhausted="raise")}
        except pb.ProviderExhausted:
            return {"email": "fallback"}

    out = engine.run(people(6), pb.play(fallback, name="fallback"), concurrency=2)
    assert set(out.statuses) <= {"ok", "reused"} and set(out.result["email"]) == {"fallback"}


# -- a provider that is down ---------------------------------------------------------------------


@pytest.mark.slow  # real seconds of holds and waits, on every engine
def test_a_provider_down_for_moments_within_max_wait_holds_its_rows_until_it_is_back(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A provider answering 503 without hints for its first 3 s (a restart) goes down; its rows
    wait for its probes instead of parking, and all finish soon after it is back."""
    demo.reset(fault_rate=1.0, fault_status=503)
    back = threading.Timer(3.0, lambda: demo.configure(fault_rate=0.0))
    back.start()
    started = time.monotonic()
    try:
        out = engine.run(
            people(40), enrich(email(demo, pb.Provider(name("bouncing"), max_wait=60))), concurrency=8
        )
    finally:
        back.cancel()
    took = time.monotonic() - started
    assert set(out.statuses) <= {"ok", "reused"} and sum(out.statuses.values()) == 40, out.statuses
    assert took < 3.0 + 8.0, f"took {took:.1f}s: the rows did not come back with the provider"


@pytest.mark.slow  # real seconds of holds and waits, on every engine
def test_a_provider_down_past_max_wait_parks_its_rows_and_a_waterfall_passes_it_at_once(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A provider down for good (503 to everything): its rows wait for its probes within max_wait
    (2 s), then park with reason "down", and run.waiting_on says it is down; a waterfall whose first
    leg is that provider falls through to the second at once."""
    demo.reset(fault_rate=1.0, fault_status=503)
    dead, spare = name("dead"), name("spare")
    dead_email = email(demo, pb.Provider(dead, max_wait=2), name="dead.email")
    started = time.monotonic()
    out = engine.run(people(20), enrich(dead_email), concurrency=4)
    assert (
        out.statuses.get("parked", 0) + out.statuses.get("failed", 0) == 20
        and out.statuses.get("parked", 0) >= 12
    )
    assert set(out.parked["reason"]) == {"down"} and time.monotonic() - started < 2 + 8
    assert [h["reason"] for h in out.waiting_on if h["provider"] == dead] == ["down"]

    spare_server = pb.demo.serve(miss_rate=0.0)  # every lookup found: a leg that misses passes on too
    try:
        spare_email = email(spare_server, pb.Provider(spare), name="spare.email")

        async def waterfall(row, ctx):  # type: ignore[no-untyped-def]
            legs = [
                ctx.leg(dead_email, domain=row.domain, first=row.first),
                ctx.leg(spare_email, domain=row.domain, first=row.first),
            ]
            found, source = await ctx.waterfall("email", legs, accept=lambda v: True, with_source=True)
            return {"email": found, "source": source}

        started = time.monotonic()
        rescued = engine.run(
            people(20, calls=10).assign(n=range(100, 120)),
            pb.play(waterfall, name="waterfall"),
            concurrency=4,
        )
        assert set(rescued.statuses) <= {"ok", "reused"} and set(rescued.result["source"]) == {"spare.email"}
        assert time.monotonic() - started < 8.0  # no row waited for the dead provider's probes
    finally:
        spare_server.stop()


def test_one_input_that_always_fails_fails_its_row_not_the_provider(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Every tenth row's request always gets a 503 (a path built from the row) while the others
    are answered: every other row finishes, and those rows fail after their retries, naming the
    tool, most of them saying the request fails on its own; the provider is neither held nor down.
    (Processes sharing a store judge the provider each from its own calls; see below.)"""
    demo.reset(latency=0.02)
    lookup = name("status")
    status = pb.http_tool(
        f"{lookup}.status",
        provider=pb.Provider(lookup, max_wait=10),
        method="GET",
        url=demo.url + "/v1/status/{code}",
        params={"n": "{n}"},
        headers={"Authorization": f"Bearer {DEMO_KEY}"},
    )

    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"answer": await ctx.tool(status, code=row.code, n=row.n)}

    frame = pd.DataFrame({"n": range(100), "code": [503 if i % 10 == 9 else 200 for i in range(100)]})
    out = engine.run(frame, pb.play(play, name="status"), concurrency=8, virtual=True)
    assert out.statuses.get("ok", 0) + out.statuses.get("reused", 0) == 90, out.statuses
    assert out.result is not None and not [h for h in out.waiting_on if h["reason"] != "down"]
    if engine.same_rows:
        # Two processes run the same rows, and a row whose call the other pays for steps back
        # until the fresh rows are taken: each ends with the failing rows alone, and with no
        # answer of its own after their tries it cannot tell them from a provider that went down.
        # Health is each process's (docs/sharing.md): those rows park, reason "down", and no
        # other row waits for it.
        assert out.statuses.get("failed", 0) + out.statuses.get("parked", 0) == 10
        assert set(out.parked["reason"]) <= {"down"}
        return
    assert out.statuses.get("failed") == 10 and not out.waiting_on, out.statuses
    errors = out.result.loc[out.result["play_status"] == "failed", "play_error"].tolist()
    assert all(
        f"tool '{lookup}.status'" in e and "HTTP 503" in e and e.endswith("(gave up after 5 tries)")
        for e in errors
    ), errors
    # A failing row near the end may find nothing else answered after its tries: it gives up as before.
    assert sum("this request fails on its own" in e for e in errors) >= 7, errors
    assert demo.stats()["by_status"]["503"] == 10 * 5


# -- credentials, budget, waterfall ----------------------------------------------------------------


def test_refused_credentials_stop_the_run_at_once(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A 401 (the key is wrong) stops the run with RunFatal: few requests, the rows not done are
    skipped, and what was answered before stays paid for."""
    demo.reset(api_keys=("another-key",), latency=0.02)
    play = enrich(email(demo, pb.Provider(name("acme"))))
    out = engine.run(people(100), play, concurrency=4)
    assert out.fatal is not None and "RunFatal" in out.fatal and "401" in out.fatal
    assert requests(demo) <= 4 * 4  # the calls in flight when the first 401 came back, per process
    assert out.statuses.get("skipped", 0) + out.statuses.get("failed", 0) == 100
    demo.reset(api_keys=(DEMO_KEY,))
    again = engine.run(people(100), play, concurrency=4)
    assert set(again.statuses) <= {"ok", "reused"} and requests(demo) == 100


def test_a_waterfall_falls_through_a_provider_held_past_max_wait(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A first leg whose quota is used up for the day passes to the second at once: every row is
    answered, by the second leg once the first is held, and run.waterfalls counts each leg."""
    demo.reset(quota=8, quota_reset=3600)
    spare_server = pb.demo.serve(miss_rate=0.0)  # every lookup found: a leg that misses passes on too
    try:
        first = email(demo, pb.Provider(name("quota"), concurrency=1, max_wait=30), name="quota.email")
        second = email(spare_server, pb.Provider(name("spare")), name="spare.email")

        async def waterfall(row, ctx):  # type: ignore[no-untyped-def]
            legs = [
                ctx.leg(first, domain=row.domain, first=row.first),
                ctx.leg(second, domain=row.domain, first=row.first),
            ]
            found, source = await ctx.waterfall("email", legs, accept=lambda v: True, with_source=True)
            return {"email": found, "source": source}

        out = engine.run(people(30), pb.play(waterfall, name="waterfall"), concurrency=3)
        assert set(out.statuses) <= {"ok", "reused"} and sum(out.statuses.values()) == 30
        sources = out.result["source"].value_counts().to_dict()
        assert sources.get("spare.email", 0) >= 30 - 8 * len(out.runs) and sources.get("quota.email", 0) >= 1
        legs = out.waterfalls.set_index("tool")
        assert legs.loc["quota.email", "unavailable"] >= 1 and legs.loc["spare.email", "hits"] >= 1
    finally:
        spare_server.stop()
