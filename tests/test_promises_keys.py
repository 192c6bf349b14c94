"""Pools of keys: ``pb.Provider(name, keys=[pb.secret(...), ...])``.  Each key has its own limits, a
call goes under the key with the most room, a refused key retires while the run goes on under the
others, a key out of its quota holds only itself, and receipts answer whichever key asks.

Each promise runs on every engine (one process, processes sharing Redis, a Dask cluster), against
the demo provider, which checks each key's limits itself and counts what each key was answered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from engines import Engine
from promises import email, enrich, people, requests

import playbook as pb

KEYS = {
    "POOL_KEY_A": "pool-key-aaaa-0001",
    "POOL_KEY_B": "pool-key-bbbb-0002",
    "POOL_KEY_C": "pool-key-cccc-0003",
}


def _keys(engine: Engine, *names: str) -> list[pb.Secret]:
    for env in names:
        engine.setenv(env, KEYS[env])
    return [pb.secret(env) for env in names]


def _by_key(demo: pb.demo.DemoServer, env: str) -> dict[str, int]:
    return dict(demo.stats()["by_key"].get("…" + KEYS[env][-4:], {}))


def _when(condition: Callable[[], bool], then: Callable[[], None]) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + 120
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow  # real seconds of holds and waits, on every engine
def test_two_keys_of_a_strict_provider_carry_the_run_together_within_their_own_limits(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Two keys of 10 requests a second each, in strict buckets (no burst): every row finishes, each
    key carries about half the calls, the provider let in more than one key's rate within a second
    (both keys at once), and almost nothing was refused."""
    demo.reset(api_keys=tuple(KEYS.values()), rps=10, burst=1, miss_rate=0)
    keys = _keys(engine, "POOL_KEY_A", "POOL_KEY_B")
    play = enrich(email(demo, pb.Provider(name("pool"), keys=keys, rps=10, burst=1)))
    out = engine.run(people(100), play, concurrency=8)
    assert out.statuses == {"ok": 100}
    a, b = _by_key(demo, "POOL_KEY_A"), _by_key(demo, "POOL_KEY_B")
    assert a["ok"] + b["ok"] == 100 and min(a["ok"], b["ok"]) >= 30, (a, b)
    stats = demo.stats()
    # On the provider's clock, within a second: one key's strict bucket lets in 11 at most (ten, and
    # the token it starts with), two keys at once some 20.  Not over the run's whole span, which
    # counts the engine's pauses (workers starting partitions on a loaded machine) as the
    # provider's: one such run measured 10.1/s with both keys at work.
    most = stats["admitted_most_in_a_second"]
    assert most >= 15, f"the provider let in at most {most} requests in a second: one key's rate, not two"
    assert stats["by_status"].get("429", 0) <= 0.1 * stats["requests"], stats["by_status"]


@pytest.mark.slow  # real seconds of holds and waits, on every engine
def test_a_key_revoked_mid_run_retires_and_the_run_completes_on_the_others(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Three keys; key B is revoked (401) after 40 requests: B leaves the pool, no row fails for it,
    and A and C answer the rest.  Each call is still paid once."""
    demo.reset(api_keys=tuple(KEYS.values()), rps=20, burst=2, miss_rate=0)
    keys = _keys(engine, "POOL_KEY_A", "POOL_KEY_B", "POOL_KEY_C")
    play = enrich(email(demo, pb.Provider(name("pool"), keys=keys, rps=20, burst=2)))
    _when(
        lambda: requests(demo) >= 40,
        lambda: demo.configure(api_keys=(KEYS["POOL_KEY_A"], KEYS["POOL_KEY_C"])),
    )
    out = engine.run(people(150), play, concurrency=8)
    assert out.fatal is None and out.statuses == {"ok": 150}
    a, b, c = (_by_key(demo, env) for env in ("POOL_KEY_A", "POOL_KEY_B", "POOL_KEY_C"))
    assert b["rejected"] >= 1 and b["ok"] < 75, b  # B was refused, and left before carrying its share
    assert a["ok"] + b["ok"] + c["ok"] == 150  # every row ok: each of the 150 calls was answered once
    said = [note for note in out.notices if "POOL_KEY_B" in note]  # the run says so, wherever it ran
    assert said and "left the pool for the run (HTTP 401)" in said[0] and KEYS["POOL_KEY_B"] not in said[0], (
        out.notices
    )


def test_every_key_refused_stops_the_run_naming_each_key(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Both keys refused: RunFatal, as for a single refused key, naming each key (by its variable),
    never a key's value."""
    demo.reset(api_keys=("someone-else-key",), miss_rate=0)
    keys = _keys(engine, "POOL_KEY_A", "POOL_KEY_B")
    play = enrich(email(demo, pb.Provider(name("pool"), keys=keys, concurrency=2)))
    out = engine.run(people(20), play, concurrency=2)
    assert out.fatal is not None and "no key is left to call with" in out.fatal
    assert "POOL_KEY_A" in out.fatal and "POOL_KEY_B" in out.fatal
    assert not any(value in out.fatal for value in KEYS.values())


def test_a_call_answered_under_one_key_is_reused_under_another(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Receipts belong to the account, not the key: a run under keys A and B, then another play
    making the same calls under C and B (swapped, one new), sends nothing."""
    demo.reset(api_keys=tuple(KEYS.values()), miss_rate=0)
    provider = name("pool")
    first = enrich(
        email(demo, pb.Provider(provider, keys=_keys(engine, "POOL_KEY_A", "POOL_KEY_B"), concurrency=4))
    )
    assert engine.run(people(40), first, concurrency=4).statuses == {"ok": 40}
    sent = requests(demo)
    tool = email(demo, pb.Provider(provider, keys=_keys(engine, "POOL_KEY_C", "POOL_KEY_B"), concurrency=4))

    async def again(row, ctx):  # type: ignore[no-untyped-def]
        return {"found": await ctx.tool(tool, domain=row.domain, first=row.first)}

    out = engine.run(people(40), pb.play(again, name="again"), concurrency=4)
    assert out.statuses == {"ok": 40} and out.total("calls_executed") == 0
    assert requests(demo) == sent


def test_a_key_out_of_its_daily_quota_holds_only_itself(
    engine: Engine, demo: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """Key A's daily quota runs out halfway (429, Retry-After a day): A holds its own calls until
    tomorrow while the rows go on under key B; no row parks or waits for A."""
    demo.reset(
        api_keys=tuple(KEYS.values()),
        miss_rate=0,
        quota=30,
        quota_keys=(KEYS["POOL_KEY_A"],),
        quota_reset=86400,
    )
    keys = _keys(engine, "POOL_KEY_A", "POOL_KEY_B")
    play = enrich(email(demo, pb.Provider(name("pool"), keys=keys, concurrency=4, max_wait=30)))
    started = time.monotonic()
    out = engine.run(people(120), play, concurrency=8)
    assert out.statuses == {"ok": 120} and out.parked.empty
    a, b = _by_key(demo, "POOL_KEY_A"), _by_key(demo, "POOL_KEY_B")
    assert a["ok"] == 30 and a["quota_exceeded"] >= 1 and b["ok"] == 90, (a, b)
    assert time.monotonic() - started < 60  # nobody waited out a day, nor max_wait


def test_a_retry_after_every_key_was_refused_runs_the_rest_once_the_keys_are_renewed(
    demo: pb.demo.DemoServer, name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every key refused stops the run (RunFatal, the rest skipped); once the keys are renewed,
    ``run.retry()`` takes every key back and runs the failed and skipped rows, raising nothing."""
    for env in ("POOL_KEY_A", "POOL_KEY_B"):
        monkeypatch.setenv(env, KEYS[env])
    demo.reset(api_keys=("someone-else-key",), miss_rate=0)
    provider = pb.Provider(
        name("pool"), keys=[pb.secret("POOL_KEY_A"), pb.secret("POOL_KEY_B")], concurrency=2
    )
    play = enrich(email(demo, provider))
    with pytest.raises(pb.RunFatal, match="no key is left to call with"):
        people(20).play.run(play, store=tmp_path / "s", concurrency=2, progress=False)
    run = pb.last_run()
    assert run is not None and run.stats.ok == 0 and run.stats.skipped >= 15
    demo.configure(api_keys=tuple(KEYS.values()))
    again = run.retry()
    assert again.stats.ok == again.stats.total == 20 and again.stats.failed == again.stats.skipped == 0
    assert [s.retired for s in provider.status().keys] == [None, None]
