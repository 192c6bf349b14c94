"""The README's promises, each written once and run on every engine: one process, several
processes sharing a Redis store and limiter, and a dask.distributed cluster (``engines``).

The provider is the demo's, a real HTTP server, whose counters say what was paid: a request
admitted and answered, per ``Idempotency-Key`` (the receipt key).  Providers get names of their
own in each test: a worker process keeps a provider's live state (a hold, a down spell) from
one job to the next, as a kernel does.  A promise an engine cannot keep is a failing test.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
from engines import ENGINES, THREADS, WORKERS, Cluster, Engine, OneProcess, Processes
from exact import same

import playbook as pb
from playbook.demo.settings import DEMO_KEY


@pytest.fixture(scope="module")
def dask_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from distributed import Client, LocalCluster

    # The workers' own marks of stores are theirs, as on other machines: not the client's.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PLAYBOOK_MARKS", str(tmp_path_factory.mktemp("worker-marks")))
        cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=THREADS, processes=True, dashboard_address=":0",
                               silence_logs=logging.ERROR)  # fmt: skip
    with cluster, Client(cluster) as client:
        yield client


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Engine:
    """Each engine in turn: the promise is the same on every one."""
    if request.param == "one process":
        return OneProcess(tmp_path / "store", tmp_path)
    redis_url = request.getfixturevalue("redis_url")
    if request.param == "processes":
        return Processes(redis_url, tmp_path)
    return Cluster(request.getfixturevalue("dask_client"), redis_url)


@pytest.fixture
def name() -> Callable[[str], str]:
    """A provider's name for this test alone."""
    token = uuid.uuid4().hex[:6]
    return lambda base: f"{base}-{token}"


def people(n: int, calls: int | None = None) -> pd.DataFrame:
    """``n`` rows; with ``calls``, only that many different calls among them (rows i and
    i + calls look up the same person)."""
    k = calls or n
    return pd.DataFrame({"n": range(n), "domain": [f"company{i % k}.com" for i in range(n)], "first": [f"P{i % k}" for i in range(n)]})


def enrich(tool: pb.Tool) -> pb.Play:
    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    return pb.play(play, name="enrich")


def email(demo: pb.demo.DemoServer, provider: pb.Provider, **options: Any) -> pb.Tool:
    return pb.demo.email_tool(demo, provider=provider, **options)


def requests(demo: pb.demo.DemoServer) -> int:
    return int(demo.stats()["requests"])


def answered(demo: pb.demo.DemoServer) -> int:
    """Requests the provider answered (every status but 429: a refusal is not paid)."""
    stats = demo.stats()
    return int(stats["requests"] - stats["by_status"].get("429", 0))


# -- never pay twice -------------------------------------------------------------------------------


def test_each_call_is_paid_once_and_a_rerun_pays_nothing(engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]) -> None:
    """90 rows making 30 different calls: each call is paid once (once in all, however many
    processes run the rows), and a rerun reuses every row, paying nothing."""
    demo.reset(latency=0.02)
    play = enrich(email(demo, pb.Provider(name("acme"), concurrency=4)))
    first = engine.run(people(90, calls=30), play, concurrency=4)
    stats = demo.stats()
    assert set(first.statuses) <= {"ok", "reused"} and sum(first.statuses.values()) == 90
    assert stats["requests"] == 30 and stats["duplicate_idempotency_keys"] == 0
    again = engine.run(people(90, calls=30), play, concurrency=4)
    assert again.statuses == {"reused": 90} and requests(demo) == 30
    assert again.result["email"].tolist() == first.result["email"].tolist()


def test_a_client_error_is_an_answer_asked_once_and_never_again(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """30 rows asking 3 different calls the provider refuses (HTTP 422): 3 requests in all, however
    many processes run the rows; every row fails with the provider's words, each call is counted
    once as paid and the rest as answered by its receipt; a rerun sends nothing."""
    play = enrich(email(demo, pb.Provider(name("acme"), concurrency=4)))
    frame = people(30, calls=3).assign(domain=lambda f: [f"not a domain {i % 3}" for i in range(len(f))])
    first = engine.run(frame, play, concurrency=4)
    assert first.statuses == {"failed": 30} and requests(demo) == 3
    assert first.result["play_error"].str.contains("HTTP 422").all()
    assert first.total("calls_executed") == 3
    counted = first.total("calls_executed") + first.total("calls_shared") + first.total("calls_reused")
    assert counted == 30 * len(first.runs)  # each process that ran the 30 rows counts each of their calls once
    again = engine.run(frame, play, concurrency=4)
    assert again.statuses == {"failed": 30} and requests(demo) == 3 and again.total("calls_executed") == 0


def test_a_store_that_lost_its_receipts_is_refused_before_anything_is_paid(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """The store wiped between two runs (the file emptied, the Redis database flushed): the next
    run pays nothing and says what was lost, until the store is reset; then it pays again."""
    play = enrich(email(demo, pb.Provider(name("acme"))))
    engine.run(people(12), play, concurrency=4)
    assert requests(demo) == 12
    engine.wipe_store()
    message = engine.refused(people(12), play, concurrency=4)
    assert "held 12 receipts" in message and "now holds 0" in message and "reset()" in message, message
    assert requests(demo) == 12  # nothing paid
    pb.ReceiptStore(engine.store).reset()
    again = engine.run(people(12), play, concurrency=4)
    assert set(again.statuses) <= {"ok", "reused"} and requests(demo) == 24


def test_a_process_killed_mid_run_pays_again_at_most_its_calls_in_flight(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """kill -9 of a process (one of the processes, a cluster worker) midway: the run (or a rerun)
    ends every row, and the calls paid twice are at most what the dead process had in flight.
    What a run counts as paid is what the provider was paid for and recorded: a cluster job that
    lost a worker counts the calls that worker landed after its last report (its rows, run again
    elsewhere, find them as receipts)."""
    demo.reset(latency=0.05)
    frame, play = people(160), enrich(email(demo, pb.Provider(name("acme"))))
    bound, going_on = engine.kill_when(frame, play, lambda: requests(demo) >= 40, concurrency=3)
    if going_on is not None:  # the job finished every row: each of the 160 calls landed once
        assert going_on.total("calls_executed") == 160, going_on.runs
    before = requests(demo)
    rerun = engine.run(frame, play, concurrency=3)
    assert set(rerun.statuses) <= {"ok", "reused"} and sum(rerun.statuses.values()) == 160
    assert rerun.total("calls_executed") == requests(demo) - before
    extra = requests(demo) - 160
    assert 0 <= extra <= bound, f"{extra} calls paid twice; the killed process had at most {bound} in flight"


# -- replays change nothing ------------------------------------------------------------------------


def test_a_replay_gives_back_exactly_the_values_first_returned(engine: Engine, name: Callable[[str], str]) -> None:
    """Values JSON lacks (an aware datetime, a date, Decimal, a tuple, bytes, a big int, a numpy
    scalar, inf) come back from a row's memo, and from receipts under an edited play, with the
    same type and value as the first run gave."""
    tool_name = name("odd")

    @pb.tool(name=tool_name, version="1", cost=0.5)
    def odd(n: int) -> dict[str, Any]:
        tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
        return {"when": dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=tz), "day": dt.date(2026, 1, 1 + n % 28),
                "money": decimal.Decimal("1.10") * n, "pair": (n, "x"), "raw": bytes([n % 256, 255]), "big": 2**70 + n,
                "count": np.int32(n), "far": float("inf")}  # fmt: skip

    def play(version: str) -> pb.Play:
        async def values(row, ctx):  # type: ignore[no-untyped-def]
            return {"value": await ctx.tool(odd, n=row.n)}

        return pb.play(values, name="values", version=version)

    frame = pd.DataFrame({"n": range(12)})
    first = engine.run(frame, play("1"))
    memo = engine.run(frame, play("1"))
    receipts = engine.run(frame, play("2"))  # a new play: its rows run, every call from its receipt
    assert set(first.statuses) <= {"ok", "reused"} and memo.statuses == {"reused": 12}
    assert receipts.total("calls_executed") == 0 and receipts.total("calls_reused") >= 12
    for again in (memo, receipts):
        for a, b in zip(first.result["value"], again.result["value"]):
            assert same(a, b), (a, b)
    assert same(first.result["value"].iloc[3], odd.fn(3))  # what the play got the first time is what the tool returned


# -- a rerun is a resume -------------------------------------------------------------------------


def test_a_rerun_runs_only_the_rows_that_did_not_finish(engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]) -> None:
    """Rows that failed (a 503 on every 5th request, no retries) are the only ones a rerun runs:
    the rest are reused, and it pays only for their calls."""
    demo.reset(fault_every=5, fault_status=503)
    provider = pb.Provider(name("acme"), retries=0)
    play = enrich(email(demo, provider))
    first = engine.run(people(60), play, concurrency=4)
    failed = first.statuses.get("failed", 0)
    assert failed > 0 and first.statuses.get("ok", 0) + first.statuses.get("reused", 0) + failed == 60
    demo.configure(fault_every=None)
    paid_before = answered(demo)
    again = engine.run(people(60), play, concurrency=4)
    assert set(again.statuses) <= {"ok", "reused"} and again.statuses.get("reused", 0) >= 60 - failed
    assert again.statuses.get("ok", 0) + again.statuses.get("reused", 0) == 60
    assert answered(demo) - paid_before == failed  # exactly the failed rows' calls, once each


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
    assert out.statuses.get("parked", 0) == 20 and out.statuses.get("ok", 0) + out.statuses.get("reused", 0) == 10
    assert set(out.parked["reason"]) == {"hold"} and set(out.parked["provider"]) == {quota}
    ready = out.parked["ready_at"].map(lambda t: t.timestamp())
    assert (ready > started + 3000).all() and (ready < time.time() + 3700).all()
    [hold] = [h for h in out.holds if h["provider"] == quota]
    assert hold["reason"] == "hold" and hold["parked_rows"] >= 1 and hold["last_status"] == 429
    assert hold["until"] is not None and hold["until"] > started + 3000


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
    assert answered(demo) == 20 and demo.stats()["duplicate_idempotency_keys"] <= demo.stats()["by_status"].get("429", 0)


@pytest.mark.parametrize("caught", [Exception, BaseException], ids=["except Exception", "except BaseException"])
def test_a_hold_past_max_wait_caught_by_the_play_still_parks_the_row(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str], caught: type[BaseException]
) -> None:
    """A play that catches everything around ctx.tool (to use a fallback) cannot finish a row
    the provider holds past max_wait: the row parks with the hold's reason, no memo is kept,
    and once the hold is over a rerun pays for each such row once, with the real answer."""
    demo.reset(quota=5, quota_reset=3)
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
    again = engine.run(people(12), play, concurrency=3)
    assert again.statuses.get("reused", 0) == 5 and again.statuses.get("ok", 0) == 7  # the parked rows had no memo
    assert answered(demo) - paid_before == 7 and "fallback" not in set(again.result["email"].dropna())


def test_a_play_may_opt_in_to_handle_a_hold_past_max_wait(engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]) -> None:
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
        out = engine.run(people(40), enrich(email(demo, pb.Provider(name("bouncing"), max_wait=60))), concurrency=8)
    finally:
        back.cancel()
    took = time.monotonic() - started
    assert set(out.statuses) <= {"ok", "reused"} and sum(out.statuses.values()) == 40, out.statuses
    assert took < 3.0 + 8.0, f"took {took:.1f}s: the rows did not come back with the provider"


def test_a_provider_down_past_max_wait_parks_its_rows_and_a_waterfall_passes_it_at_once(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A provider down for good (503 to everything): its rows wait for its probes within max_wait
    (2 s), then park with reason "down", and run.holds says it is down; a waterfall whose first
    leg is that provider falls through to the second at once."""
    demo.reset(fault_rate=1.0, fault_status=503)
    dead, spare = name("dead"), name("spare")
    dead_email = email(demo, pb.Provider(dead, max_wait=2), name="dead.email")
    started = time.monotonic()
    out = engine.run(people(20), enrich(dead_email), concurrency=4)
    assert out.statuses.get("parked", 0) + out.statuses.get("failed", 0) == 20 and out.statuses.get("parked", 0) >= 12
    assert set(out.parked["reason"]) == {"down"} and time.monotonic() - started < 2 + 8
    assert [h["reason"] for h in out.holds if h["provider"] == dead] == ["down"]

    spare_server = pb.demo.serve(miss_rate=0.0)  # every lookup found: a leg that misses passes on too
    try:
        spare_email = email(spare_server, pb.Provider(spare), name="spare.email")

        async def waterfall(row, ctx):  # type: ignore[no-untyped-def]
            legs = [ctx.call(dead_email, domain=row.domain, first=row.first), ctx.call(spare_email, domain=row.domain, first=row.first)]
            found, source = await ctx.waterfall("email", legs, accept=lambda v: True, with_source=True)
            return {"email": found, "source": source}

        started = time.monotonic()
        rescued = engine.run(people(20, calls=10).assign(n=range(100, 120)), pb.play(waterfall, name="waterfall"), concurrency=4)
        assert set(rescued.statuses) <= {"ok", "reused"} and set(rescued.result["source"]) == {"spare.email"}
        assert time.monotonic() - started < 8.0  # no row waited for the dead provider's probes
    finally:
        spare_server.stop()


# -- credentials, budget, waterfall ----------------------------------------------------------------


def test_refused_credentials_stop_the_run_at_once(engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]) -> None:
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


def test_max_cost_is_one_budget_per_run(engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]) -> None:
    """max_cost=10 with calls costing 1: a run (the cluster's whole job; each process's own run)
    pays for at most 10 calls and parks the rest with reason "budget"."""
    play = enrich(email(demo, pb.Provider(name("acme"), concurrency=2), cost=1.0))
    out = engine.run(people(40), play, concurrency=3, max_cost=10)
    for run in out.runs:
        assert run["cost_spent"] <= 10.0 and run["calls_executed"] <= 10
    assert max(run["cost_spent"] for run in out.runs) == 10.0  # what fits is paid for
    assert requests(demo) <= 10 * len(out.runs)
    assert out.statuses.get("parked", 0) >= 40 - 10 * len(out.runs) and set(out.parked["reason"]) == {"budget"}


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
            legs = [ctx.call(first, domain=row.domain, first=row.first), ctx.call(second, domain=row.domain, first=row.first)]
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


# -- stop and Ctrl-C ---------------------------------------------------------------------------


def test_a_stopped_run_lands_its_calls_in_flight_and_a_rerun_pays_the_rest(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """run.stop() (Ctrl-C in a process) midway: nothing is sent after it, every call sent lands its
    receipt, the rows not done are skipped, and a rerun pays only for those: each call once in all."""
    demo.reset(latency=0.1)
    frame, play = people(200), enrich(email(demo, pb.Provider(name("acme"))))
    out = engine.stop_when(frame, play, lambda: requests(demo) >= 30, concurrency=4)
    sent = requests(demo)
    time.sleep(0.3)
    assert requests(demo) == sent, "calls went out after the stop"
    assert out.statuses.get("skipped", 0) > 0 and sum(out.statuses.values()) == 200
    again = engine.run(frame, play, concurrency=8)
    assert set(again.statuses) <= {"ok", "reused"}
    assert requests(demo) == 200 and demo.stats()["duplicate_idempotency_keys"] == 0
