"""The README's first promise: never pay twice, never change the data.  Each call is paid once,
a replay gives back exactly what was first returned, a rerun resumes, a crash or a stop loses at
most the calls in flight, and a budget is one budget.

Each promise is written once and run on every engine: one process, several processes sharing a
Redis store and limiter, and a dask.distributed cluster (``engines``, and the ``engine`` fixture in
``conftest``).  The provider is the demo's, a real HTTP server, whose counters say what was paid.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import decimal
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from engines import Engine, Outcome
from exact import same
from promises import answered, email, enrich, people, requests, verdict_model

import playbook as pb
from playbook.demo.settings import DEMO_KEY
from playbook.frontends import cli

# -- never pay twice -------------------------------------------------------------------------------


def test_each_call_is_paid_once_and_a_rerun_pays_nothing(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
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
    assert counted == 30 * len(
        first.runs
    )  # each process that ran the 30 rows counts each of their calls once
    again = engine.run(frame, play, concurrency=4)
    assert again.statuses == {"failed": 30} and requests(demo) == 3 and again.total("calls_executed") == 0


def test_a_store_that_lost_its_receipts_is_refused_before_anything_is_paid(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """The store wiped between two runs (the file emptied, the Redis database flushed): the next
    run pays nothing and says what was lost, until its loss is accepted; then it pays again."""
    play = enrich(email(demo, pb.Provider(name("acme"))))
    engine.run(people(12), play, concurrency=4)
    assert requests(demo) == 12
    engine.wipe_store()
    message = engine.refused(people(12), play, concurrency=4)
    assert "held 12 receipts" in message and "now holds 0" in message and "accept_loss()" in message, message
    assert requests(demo) == 12  # nothing paid
    pb.ReceiptStore(engine.store).accept_loss()
    again = engine.run(people(12), play, concurrency=4)
    assert set(again.statuses) <= {"ok", "reused"} and requests(demo) == 24


def test_receipts_lost_while_a_run_goes_on_are_said_and_the_next_run_refused(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str], tmp_path: Path
) -> None:
    """Receipts lost behind playbook's back while a run goes on (deleted from receipts.db, or
    from Redis as a server restarted without its data loses them), once 3 of the run's 12 are in:
    the run says so, and the next run, in any process, pays nothing until its loss is accepted (here
    from the command line); then it runs."""
    tool = email(demo, pb.Provider(name("acme")))
    engine.run(people(12), enrich(tool), concurrency=4)
    assert requests(demo) == 12
    where, once = engine.store, str(tmp_path / "lost")

    def held() -> int:
        with pb.ReceiptStore(where, readonly=True) as store:
            return int(store.stats()["receipts"])

    def lost() -> bool:
        return os.path.exists(once)

    def lose() -> None:
        if where.startswith("redis://"):
            from playbook._internal.redis_nodes import sync_client

            # the receipts and their counts, as a server back without its data has neither
            client = sync_client(where)
            for pattern in ("playbook:r*", "playbook:count", "playbook:n{*"):
                for key in client.scan_iter(match=pattern):
                    client.delete(key)
            client.close()
        else:
            import sqlite3

            with sqlite3.connect(os.path.join(where, "receipts.db")) as con:
                con.execute("DELETE FROM receipt")
            con.close()

    async def losing(row, ctx):  # type: ignore[no-untyped-def]
        if row.n == 18:  # in whichever process gets there first, once 3 of this run's receipts are in
            deadline = time.monotonic() + 60
            # (the other process's row 18, once the first lost them, has nothing to wait for)
            while held() < 15 and not lost() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            with contextlib.suppress(FileExistsError):
                os.close(os.open(once, os.O_CREAT | os.O_EXCL))
                lose()
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    play = pb.play(losing, name="enrich")
    frame = people(24).iloc[12:].reset_index(drop=True)
    out = engine.run(frame, play, concurrency=4)
    assert os.path.exists(once) and set(out.statuses) <= {"ok", "reused"}
    assert [note for note in out.notices if "lost receipts while this run went on" in note], out.notices
    paid = requests(demo)
    message = engine.refused(frame, play, concurrency=4)
    assert (
        "receipts at" in message and "cache accept-loss --store" in message and ".accept_loss()" in message
    ), message
    assert requests(demo) == paid  # nothing paid
    assert cli.main(["cache", "accept-loss", "--store", where, "--yes"]) == 0
    again = engine.run(
        frame, play, concurrency=4
    )  # accepted: it runs (its rows' memos were not lost: nothing to pay)
    assert (
        set(again.statuses) <= {"ok", "reused"}
        and sum(again.statuses.values()) == 12
        and requests(demo) <= paid + 12
    )


def test_a_process_killed_mid_run_pays_again_at_most_its_calls_in_flight(
    engine: Engine, demo_elsewhere: Any, name: Callable[[str], str]
) -> None:
    """kill -9 of a process (one of the processes, a cluster worker) midway: the run (or a rerun)
    ends every row, and the calls paid twice are at most what the dead process had in flight.
    A cluster job that lost a worker counts every request the provider saw once: the calls the
    dead attempt landed after its last report as paid, those it had begun to send as failed (the
    provider saw those or not, as the kill fell); and its counters say of each row what its
    result says, for the partitions Dask ran again too.  (The
    provider is in a process of its own on every engine: the process killed, one of its own
    even for "one process", reaches it by socket.)"""
    demo = demo_elsewhere
    demo.reset(latency=0.05)
    frame, play = people(160), enrich(email(demo, pb.Provider(name("acme"))))
    bound, going_on = engine.kill_when(frame, play, lambda: requests(demo) >= 96, concurrency=3)
    if going_on is not None:  # the job finished every row: each of the 160 calls landed once
        assert going_on.total("calls_executed") == 160, going_on.runs
        sent, seen = going_on.total("calls_executed") + going_on.total("calls_failed"), requests(demo)
        # Each request the provider saw is counted; a call the dead worker had begun to send is
        # counted as failed whether or not its bytes reached the provider before the kill, so the
        # job may count up to what that worker had in flight beyond what the provider saw.
        assert seen <= sent <= seen + bound, f"the job counted {sent} requests, the provider saw {seen}"
        counted = {status: going_on.runs[0][status] for status in going_on.statuses}
        assert counted == going_on.statuses, (
            f"run.stats says {going_on.runs[0]}, the result {going_on.statuses}"
        )
    before = requests(demo)
    rerun = engine.run(frame, play, concurrency=3)
    assert set(rerun.statuses) <= {"ok", "reused"} and sum(rerun.statuses.values()) == 160
    assert rerun.total("calls_executed") == requests(demo) - before
    extra = requests(demo) - 160
    assert 0 <= extra <= bound, f"{extra} calls paid twice; the killed process had at most {bound} in flight"


# -- replays change nothing ------------------------------------------------------------------------


def test_a_replay_gives_back_exactly_the_values_first_returned(
    engine: Engine, name: Callable[[str], str]
) -> None:
    """Values JSON lacks (an aware datetime, a date, Decimal, a tuple, bytes, a big int, a numpy
    scalar, inf) come back from a row's memo, and from receipts under an edited play, with the
    same type and value as the first run gave."""
    tool_name = name("odd")

    @pb.tool(name=tool_name, version="1", cost=0.5)
    def odd(n: int) -> dict[str, Any]:
        tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
        return {
            "when": dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=tz),
            "day": dt.date(2026, 1, 1 + n % 28),
            "money": decimal.Decimal("1.10") * n,
            "pair": (n, "x"),
            "raw": bytes([n % 256, 255]),
            "big": 2**70 + n,
            "count": np.int32(n),
            "far": float("inf"),
        }

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
    assert same(
        first.result["value"].iloc[3], odd(3)
    )  # what the play got the first time is what the tool returned


# -- a rerun is a resume -------------------------------------------------------------------------


def test_a_rerun_runs_only_the_rows_that_did_not_finish(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Rows that failed (a 500 on every 5th request, no retries) are the only ones a rerun runs:
    the rest are reused, and it pays only for their calls."""
    demo.reset(fault_every=5, fault_status=500)
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


def test_a_rerun_reuses_a_plays_rows_until_the_tool_it_reaches_is_another(
    engine: Engine, name: Callable[[str], str]
) -> None:
    """Cells of one notebook: a tool, a helper that calls it, a play that calls the helper.  A rerun
    reuses every row; the tool's cell run again with another tool (renamed, computing otherwise),
    and nothing else, runs every row again with the new tool's values, and the rerun after reuses them."""
    cells: dict[str, Any] = {
        "__name__": "cells",
        "pb": pb,
    }  # a namespace no process can import: sent by value
    tool_cell = '@pb.tool(name={name!r}, version="1")\ndef scale(x: int) -> int:\n    return x * {factor}\n'
    exec(tool_cell.format(name=name("double"), factor=2), cells)
    exec("async def fetch(ctx, x):\n    return {'y': await ctx.tool(scale, x=x)}\n", cells)
    exec("@pb.play\nasync def via_helper(row, ctx):\n    return await fetch(ctx, row.x)\n", cells)
    frame = pd.DataFrame({"x": range(8)})
    first = engine.run(frame, cells["via_helper"])
    assert set(first.statuses) <= {"ok", "reused"} and first.result["y"].tolist() == [2 * x for x in range(8)]
    assert engine.run(frame, cells["via_helper"]).statuses == {"reused": 8}
    exec(tool_cell.format(name=name("hundred"), factor=100), cells)
    pointed = engine.run(frame, cells["via_helper"])
    assert pointed.result["y"].tolist() == [100 * x for x in range(8)] and pointed.statuses.get("ok", 0) >= 1
    assert engine.run(frame, cells["via_helper"]).statuses == {"reused": 8}


def test_a_play_reading_row_index_gets_each_rows_own_label_and_new_labels_run_again(
    engine: Engine, name: Callable[[str], str]
) -> None:
    """Rows of equal values under other index labels, for a play that reads row.Index: each gets its
    own label, wherever it runs; the same values under new labels run again (the first frame's
    memos do not answer them), and a rerun of either frame reuses each row with its own label."""

    async def labelled(row, ctx):  # type: ignore[no-untyped-def]
        return {"label": str(row.Index)}

    play = pb.play(labelled, name=name("labelled"))
    frame = pd.DataFrame({"a": [1] * 8}, index=[f"r{i}" for i in range(8)])
    first = engine.run(frame, play)
    assert (
        set(first.statuses) <= {"ok", "reused"}
        and first.result["label"].tolist() == first.result.index.tolist()
    )
    moved = engine.run(frame.set_axis([f"s{i}" for i in range(8)]), play)
    assert set(moved.statuses) <= {"ok", "reused"} and moved.statuses.get("ok", 0) >= 1
    assert moved.result["label"].tolist() == moved.result.index.tolist()
    again = engine.run(frame, play)
    assert again.statuses == {"reused": 8} and again.result["label"].tolist() == again.result.index.tolist()


def test_a_rerun_after_a_changed_global_pays_for_the_changed_calls_and_returns_the_new_values(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A notebook's play reading a global of the notebook (the first name it asks with): the global
    rebound in a later cell, a rerun pays for each changed call once and returns the new values;
    the rerun after reuses every row."""
    cells: dict[str, Any] = {
        "__name__": "cells",
        "pb": pb,
        "email": email(demo, pb.Provider(name("acme"))),
        "PREFIX": "Ann",
    }
    exec(
        "@pb.play\nasync def greet(row, ctx):\n    return {'email': await ctx.tool(email, domain=row.domain, first=PREFIX + row.first)}\n",
        cells,
    )
    frame = people(8)
    first = engine.run(frame, cells["greet"], concurrency=4)
    assert set(first.statuses) <= {"ok", "reused"} and requests(demo) == 8
    cells["PREFIX"] = "Zed"
    again = engine.run(frame, cells["greet"], concurrency=4)
    assert (
        set(again.statuses) <= {"ok", "reused"} and again.statuses.get("ok", 0) >= 1 and requests(demo) == 16
    )
    found = [e for e in again.result["email"].tolist() if isinstance(e, str)]
    assert found and all(e.startswith("zedp@") for e in found), again.result["email"].tolist()
    assert engine.run(frame, cells["greet"], concurrency=4).statuses == {"reused": 8} and requests(demo) == 16


def test_a_value_the_fingerprint_cannot_count_is_said_once_and_the_memos_still_answer(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A play reading an object with no stable form (a client of the notebook's, read twice): each
    run says so once, wherever its rows ran, naming the play, the name and its type; the environment
    variable it reads counts, the same in every process; the rerun reuses every row."""
    cells: dict[str, Any] = {
        "__name__": "cells",
        "pb": pb,
        "os": os,
        "email": email(demo, pb.Provider(name("acme"))),
    }
    exec(
        "class Client:\n    def __init__(self):\n        self.connection = object()  # no stable form\n\n"
        "    def first(self, name):\n        return name\n\nCLIENT = Client()\n",
        cells,
    )
    exec(
        "@pb.play\nasync def greet(row, ctx):\n    first = CLIENT.first(os.environ['PB_PROMISE_PREFIX'] + row.first)\n"
        "    return {'email': await ctx.tool(email, domain=row.domain, first=CLIENT.first(first))}\n",
        cells,
    )
    engine.setenv("PB_PROMISE_PREFIX", "Ann")
    first = engine.run(people(8), cells["greet"], concurrency=4)
    said = [note for note in first.notices if "CLIENT" in note]
    assert (
        len(said) == len(first.runs)
        and "'greet'" in said[0]
        and "cells.Client" in said[0]
        and "version=" in said[0]
    ), first.notices
    assert (
        engine.run(people(8), cells["greet"], concurrency=4).statuses == {"reused": 8} and requests(demo) == 8
    )
    engine.setenv("PB_PROMISE_PREFIX", "Zed")
    again = engine.run(people(8), cells["greet"], concurrency=4)
    found = [e for e in again.result["email"].tolist() if isinstance(e, str)]
    assert requests(demo) == 16 and found and all(e.startswith("zedp@") for e in found), again.result[
        "email"
    ].tolist()


def test_a_parameter_left_to_its_default_is_the_call_that_passes_it(
    engine: Engine, name: Callable[[str], str]
) -> None:
    """A Python tool's default is part of the call's input, as Python passes it: a play that leaves
    it out and an edited play that passes it make the same calls, paid once."""

    @pb.tool(name=name("scaled"), version="1", cost=0.5)
    def scaled(x: int, factor: int = 3) -> int:
        return x * factor

    async def implicit(row, ctx):  # type: ignore[no-untyped-def]
        return {"y": await ctx.tool(scaled, x=row.x)}

    async def explicit(row, ctx):  # type: ignore[no-untyped-def]
        return {"y": await ctx.tool(scaled, x=row.x, factor=3)}

    frame = pd.DataFrame({"x": range(8)})
    first = engine.run(frame, pb.play(implicit, name="scaled_rows", version="1"))
    assert set(first.statuses) <= {"ok", "reused"} and first.result["y"].tolist() == [3 * x for x in range(8)]
    again = engine.run(frame, pb.play(explicit, name="scaled_rows", version="2"))
    assert again.total("calls_executed") == 0 and again.total("calls_reused") >= 8
    assert again.result["y"].tolist() == first.result["y"].tolist()


def test_a_retry_runs_only_the_rows_left_pays_for_them_once_and_counts_them_alone(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Rows that failed (a 500 on every 5th request, no retries), then run.retry() once the provider
    is well: each retry runs its run's failed rows and no other, the calls they need are paid once
    in all, and the retry's stats count those rows and calls alone, while the run it retried keeps
    what it counted.  (A 500: a 503 without a hint, from a provider answering other calls, may be
    a full queue's, which is waited out and tried again.)"""
    demo.reset(fault_every=5, fault_status=500)
    play = enrich(email(demo, pb.Provider(name("acme"), retries=0)))
    paid: list[int] = []

    def well(first: Outcome) -> None:
        demo.configure(fault_every=None)
        paid.append(answered(demo))

    first, again = engine.retried(people(60), play, well, concurrency=4)
    failed = first.statuses.get("failed", 0)
    assert failed > 0 and again.statuses == {"ok": 60 - first.statuses.get("reused", 0)} | (
        {"reused": first.statuses["reused"]} if first.statuses.get("reused") else {}
    )
    assert (
        answered(demo) - paid[0] == failed == again.total("calls_executed")
    )  # each missing call once, in all
    for before, retry, previous in zip(first.runs, again.runs, again.previous):
        assert (
            retry["total"] == before["failed"] and retry["failed"] == retry["parked"] == retry["skipped"] == 0
        )
        assert retry["ok"] + retry["reused"] == retry["total"]
        assert (
            retry["calls_executed"] + retry["calls_shared"] + retry["calls_reused"] == retry["total"]
        )  # a call a row
        assert previous == before  # the run it retried counts what it did, not the retry


# -- stop and Ctrl-C ---------------------------------------------------------------------------


@pytest.mark.slow  # real seconds of holds and waits, on every engine
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


# -- a budget is one budget ----------------------------------------------------------------------


def test_max_cost_is_one_budget_per_run(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """max_cost=10 with calls costing 1: a run (the cluster's whole job; each process's own run)
    pays for at most 10 calls and parks the rest with reason "budget"."""
    play = enrich(email(demo, pb.Provider(name("acme"), concurrency=2), cost=1.0))
    out = engine.run(people(40), play, concurrency=3, max_cost=10)
    for run in out.runs:
        assert run["cost_spent"] <= 10.0 and run["calls_executed"] <= 10
    assert max(run["cost_spent"] for run in out.runs) == 10.0  # what fits is paid for
    assert requests(demo) <= 10 * len(out.runs)
    assert out.statuses.get("parked", 0) >= 40 - 10 * len(out.runs) and set(out.parked["reason"]) == {
        "budget"
    }


# -- money that bought nothing kept is counted -------------------------------------------------------


def test_money_paid_for_refused_answers_is_what_the_provider_billed_for_them(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """An LLM column whose provider answers half its JSON invalid (and bills it): cost_failed is
    exactly the provider's bill for those answers, on every engine.  A row mended by its re-ask
    counts its first answer; a row still invalid fails and counts both.  A rerun pays nothing and
    counts nothing."""
    demo.reset(chat_invalid_json_rate=0.5)
    engine.setenv("PLAYBOOK_TEST_LLM_KEY", DEMO_KEY)  # a secret travels by name: every process reads it
    prices = (0.15, 0.60)
    llm = pb.llm_tool(
        name=name("llm"),
        model="gpt-4o-mini",
        base_url=demo.url + "/v1",
        secret=pb.secret("PLAYBOOK_TEST_LLM_KEY"),
        output=verdict_model(),
        prices={"gpt-4o-mini": prices},
        provider=pb.Provider(name("chat"), concurrency=4),
    )

    async def verdict(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify company {row.n} of {row.domain}")

    out = engine.run(people(40), pb.play(verdict, name="verdict"), concurrency=4)
    billed = demo.stats()["chat_invalid"].get("gpt-4o-mini")
    assert billed, (
        out.fatal,
        out.statuses,
        out.result["play_error"].dropna().head(3).tolist() if out.result is not None else None,
    )
    assert 0 < billed["requests"] < demo.stats()["chat"]["gpt-4o-mini"]["requests"]  # some refused, not all
    assert 0 < out.statuses.get("failed", 0) < 40
    refused = (billed["prompt_tokens"] * prices[0] + billed["completion_tokens"] * prices[1]) / 1e6
    assert out.total("cost_failed") == pytest.approx(refused, rel=1e-9, abs=1e-12)
    assert out.total("cost_failed") < out.total("cost_spent")
    again = engine.run(people(40), pb.play(verdict, name="verdict"), concurrency=4)
    assert again.total("cost_spent") == again.total("cost_failed") == 0


def test_a_run_counts_the_tokens_its_paid_calls_used(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """30 rows, each an LLM call: the run's ``tokens`` are the prompt and completion tokens the
    provider counted (once, however many processes ran the rows); a rerun, answered by its
    memos, uses none."""
    engine.setenv("PLAYBOOK_TEST_LLM_KEY", DEMO_KEY)
    llm = pb.llm_tool(
        name=name("llm"),
        model="gpt-4o-mini",
        base_url=demo.url + "/v1",
        secret=pb.secret("PLAYBOOK_TEST_LLM_KEY"),
        prices={"gpt-4o-mini": (0.15, 0.60)},
        provider=pb.Provider(name("chat"), concurrency=4),
    )

    async def line(row: Any, ctx: pb.Context) -> Any:
        return {"line": await ctx.tool(llm, prompt=f"One line on company {row.n} of {row.domain}")}

    out = engine.run(people(30), pb.play(line, name="line"), concurrency=4)
    counted = demo.stats()["chat"]["gpt-4o-mini"]
    assert out.statuses == {"ok": 30} and counted["requests"] == 30, out.statuses
    assert out.total("tokens") == counted["prompt_tokens"] + counted["completion_tokens"] > 0
    assert engine.run(people(30), pb.play(line, name="line"), concurrency=4).total("tokens") == 0


def test_calls_of_a_model_with_no_price_are_unpriced_and_max_cost_refuses_them(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """An LLM column of a model no price table knows (the demo's): its calls count as unpriced,
    never $0 spent, on every engine; under max_cost the run stops at
    that tool's first call, naming it, and the provider sees no request."""
    engine.setenv("PLAYBOOK_TEST_LLM_KEY", DEMO_KEY)
    llm = pb.llm_tool(
        name=name("llm"),
        model="demo-1",
        base_url=demo.url + "/v1",
        secret=pb.secret("PLAYBOOK_TEST_LLM_KEY"),
        provider=pb.Provider(name("chat"), concurrency=4),
    )

    async def line(row: Any, ctx: pb.Context) -> Any:
        return {"line": await ctx.tool(llm, prompt=f"One line on company {row.n} of {row.domain}")}

    out = engine.run(people(20), pb.play(line, name="line"), concurrency=4)
    assert out.statuses == {"ok": 20}, out.statuses
    assert out.total("calls_executed") == out.total("calls_unpriced") == 20 and out.total("cost_spent") == 0
    demo.reset()

    async def other(row: Any, ctx: pb.Context) -> Any:  # calls no receipt answers
        return {"line": await ctx.tool(llm, prompt=f"Another line on company {row.n}")}

    refused = engine.run(people(20), pb.play(other, name="other"), concurrency=4, max_cost=5.0)
    assert refused.fatal is not None and f"cannot count tool {name('llm')!r}" in refused.fatal, refused.fatal
    assert requests(demo) == 0


def test_money_paid_for_the_calls_of_a_failed_row_is_counted_once(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """40 rows, each a paid call costing 1; every fourth row then fails in the play: cost_failed is
    10 (those rows' calls, paid once in all, however many processes ran them), and the rows
    that succeeded count nothing."""
    tool = email(demo, pb.Provider(name("acme"), concurrency=4), cost=1.0)

    async def picky(row: Any, ctx: pb.Context) -> Any:
        found = await ctx.tool(tool, domain=row.domain, first=row.first)
        if row.n % 4 == 0:
            raise ValueError(f"row {row.n} is not wanted")
        return {"email": found}

    out = engine.run(people(40), pb.play(picky, name="picky"), concurrency=4)
    assert out.statuses["failed"] == 10 and requests(demo) == 40
    assert out.total("cost_spent") == 40 and out.total("cost_failed") == 10


# -- what was spent ------------------------------------------------------------------------------------


def test_what_was_spent_is_what_the_provider_billed_and_reuse_is_counted_as_saved(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """40 rows making 20 different calls costing 0.5, then a rerun: ``store.spend()`` says 20 calls
    paid, 10.0 spent on the provider (what the provider answered, however many processes ran
    them), and every call the runs reused (from receipts or row memos) as saved."""
    provider, play_name = (
        name("acme"),
        name("enrich"),
    )  # a Redis store is the session's: lines of this test alone
    play = pb.play(enrich(email(demo, pb.Provider(provider, concurrency=4), cost=0.5)).fn, name=play_name)
    first = engine.run(people(40, calls=20), play, concurrency=4)
    again = engine.run(people(40, calls=20), play, concurrency=4)
    assert again.statuses == {"reused": 40} and requests(demo) == 20
    with pb.ReceiptStore(engine.store) as store:
        spent = store.spend(by=("provider", "tool", "day"))
        by_provider = store.spend(by="provider").set_index("provider")
    paid = spent[spent["provider"] == provider]
    assert (
        len(paid) == 1
        and paid["tool"].iat[0] == "demo.email"
        and paid["day"].iat[0] == time.strftime("%Y-%m-%d", time.gmtime())
    )
    assert by_provider.at[provider, "calls_paid"] == 20 and by_provider.at[provider, "cost_paid"] == 10.0
    reused = sum(
        run[counter]
        for out in (first, again)
        for run in out.runs
        for counter in ("calls_reused", "calls_shared")
    )
    memos = spent[spent["tool"] == f"play {play_name}"]
    assert paid["calls_reused"].iat[0] + memos["calls_reused"].sum() == reused >= 40
    assert paid["cost_saved"].iat[0] + memos["cost_saved"].sum() == reused * 0.5


# -- know before you pay ----------------------------------------------------------------------------


def test_a_pilot_paid_for_is_never_paid_again_and_its_projection_is_what_the_run_pays(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A pilot of 20 of 120 rows pays 20 calls; it projects the 100 left, which is what the run
    then pays (the pilot's rows reused, however many processes run the rest); an estimate of
    the finished frame projects nothing and sends nothing."""
    play = pb.play(
        enrich(email(demo, pb.Provider(name("acme"), concurrency=4), cost=0.5)).fn, name=name("enrich")
    )
    est = engine.estimate(people(120), play, concurrency=4)
    assert requests(demo) == 20 and (est.rows_left, est.paid_calls, est.cost) == (100, 100, 50.0)
    out = engine.run(people(120), play, concurrency=4)
    assert (
        set(out.statuses) <= {"ok", "reused"}
        and requests(demo) == 120
        and demo.stats()["duplicate_idempotency_keys"] == 0
    )
    assert out.total("calls_executed") == est.paid_calls
    again = engine.estimate(people(120), play, concurrency=4)
    assert (again.paid_calls, again.rows_left, again.reused_rows) == (0, 0, 120) and requests(demo) == 120
