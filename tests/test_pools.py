"""A provider's pool of keys, call by call, in virtual time: which key a call goes under, what a
held, failing, down or refused key does to the others, and what the pool says of itself.

Calls go straight through the provider's governor (its pool) with a ``send`` that answers as the
key it is sent under would (``chosen_key()``), so an hour of holds takes no time.  The promises
over real runs, on every engine and against the demo provider, are in ``test_promises_keys``.
"""

from __future__ import annotations

import asyncio
import pickle
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from vtime import run_virtual

import playbook as pb
from playbook._internal.flow import OnHold, WaitBudget
from playbook.events import KeyRetired, ProviderDown, ProviderHoldSet
from playbook.providers.limits import Announced
from playbook.providers.pool import chosen_key
from playbook.providers.provider import Ticket, forget_governors, governor, sharing_limits
from playbook.runtime.state.reading import RunState
from playbook.runtime.state.upstream import watch
from playbook.tools import engine_of
from playbook.ui.html import providers_table
from playbook.ui.tally import Tally
from playbook.ui.text import summary

ENV = {
    "T_KEY_A": "test-key-aaaaaaaa-A001",
    "T_KEY_B": "test-key-bbbbbbbb-B002",
    "T_KEY_C": "test-key-cccccccc-C003",
}


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, value in ENV.items():
        monkeypatch.setenv(env, value)
    forget_governors()


def keys(*names: str) -> list[pb.Secret]:
    return [pb.secret(f"T_KEY_{n}") for n in names]


def now() -> float:
    return asyncio.get_running_loop().time()


class Upstream:
    """What each key answers: ``answer(key, n)`` for its n-th call (raise to refuse or fail)."""

    def __init__(self, answer: Callable[[str, int], Any] = lambda key, n: key, latency: float = 0.01) -> None:
        self.answer = answer
        self.latency = latency
        self.calls: Counter[str] = Counter()

    async def send(self) -> Any:
        secret = chosen_key()
        assert secret is not None, "a pooled call is sent under a key"
        key = secret.env_var[-1]
        self.calls[key] += 1
        await asyncio.sleep(self.latency)
        return self.answer(key, self.calls[key])


def ticket(max_wait: float = 120.0) -> Ticket:
    return Ticket("t", WaitBudget(max_wait))


async def many(
    provider: pb.Provider, upstream: Upstream, n: int, *, max_wait: float = 120.0
) -> tuple[list[Any], float]:
    """``n`` calls at once; their answers (or errors) and the loop time the last one took."""
    gov = governor(provider)
    answers = await asyncio.gather(
        *(gov.dispatch(upstream.send, ticket(max_wait)) for _ in range(n)), return_exceptions=True
    )
    return answers, now()


# -- which key --------------------------------------------------------------------------------


def test_calls_go_to_each_key_in_proportion_to_its_rate_and_together_reach_the_sum() -> None:
    """Keys of 10 and 30 requests a second (strict: no burst): a quarter of the calls go under the
    first, and 400 calls take about 400 / 40 seconds, not the slower key's pace."""
    provider = pb.Provider("pooled", keys=keys("A", "B"), rps=[10, 30], burst=1)
    upstream = Upstream()
    answers, elapsed = run_virtual(many(provider, upstream, 400))
    assert not [a for a in answers if isinstance(a, BaseException)]
    assert 85 <= upstream.calls["A"] <= 115, upstream.calls
    assert elapsed <= 400 / (40 * 0.98) * 1.05, elapsed


def test_keys_of_equal_limits_share_the_calls_evenly() -> None:
    provider = pb.Provider("pooled", keys=keys("A", "B", "C"), rps=10, burst=1)
    upstream = Upstream()
    _, elapsed = run_virtual(many(provider, upstream, 300))
    assert max(upstream.calls.values()) - min(upstream.calls.values()) <= 3, upstream.calls
    assert elapsed <= 300 / (30 * 0.98) * 1.05


def test_a_key_held_for_a_day_leaves_its_calls_to_the_other_keys() -> None:
    """Key A's quota runs out at its 10th call (429, Retry-After a day): A is held, the calls go on
    under B at once, and the provider itself is not held (its rows do not wait or park)."""

    def answer(key: str, n: int) -> Any:
        if key == "A" and n >= 10:
            raise pb.ToolError("daily quota exceeded", status=429, retry_after=86400)
        return key

    provider = pb.Provider("pooled", keys=keys("A", "B"), rps=10, burst=1, max_wait=30)
    upstream = Upstream(answer)
    heard: list[Any] = []

    async def main() -> tuple[list[Any], float]:
        governor(provider).subscribe(heard.append)
        return await many(provider, upstream, 100, max_wait=30)

    answers, elapsed = run_virtual(main())
    assert not [a for a in answers if isinstance(a, BaseException)]
    assert upstream.calls["A"] == 10 and Counter(answers) == {"A": 9, "B": 91}
    assert elapsed < 100 / 9.8 + 2  # B's pace after A left, never a day
    status = provider.status()
    assert not status.held and status.keys[0].held and not status.keys[1].held
    assert not [e for e in heard if isinstance(e, ProviderHoldSet)]
    state = RunState()
    state.providers["pooled"] = provider
    said = summary(state, Tally(state.label)).split("\n")
    assert any(
        line.startswith("provider 'pooled': key T_KEY_A …A001 holds calls until ")
        and "the other keys went on" in line
        for line in said
    )
    assert not any("provider 'pooled' holds calls" in line for line in said)


def test_every_key_held_holds_the_provider_until_the_first_comes_back() -> None:
    """Both keys refuse with a hint (A for 50 s, B for 20 s): the provider is held until B's end, a
    call steps aside until then (OnHold), and past its wait budget it parks naming that time."""

    def answer(key: str, n: int) -> Any:
        if n == 1:
            raise pb.ToolError("slow down", status=429, retry_after=50 if key == "A" else 20)
        return key

    provider = pb.Provider("pooled", keys=keys("A", "B"), concurrency=1)
    heard: list[Any] = []

    async def main() -> tuple[Any, Any, float]:
        gov = governor(provider)
        gov.subscribe(heard.append)
        upstream = Upstream(answer)
        first = await asyncio.gather(
            gov.dispatch(upstream.send, ticket()),
            gov.dispatch(upstream.send, ticket()),
            return_exceptions=True,
        )
        try:
            await gov.dispatch(upstream.send, ticket(max_wait=5))
        except pb.ProviderExhausted as exc:
            parked: Any = exc
        return first, parked, now()

    first, parked, at = run_virtual(main())
    assert all(isinstance(f, OnHold) for f in first), first
    assert [round(f.until) for f in first] == [20, 20]  # the first key back, not the last
    assert (
        parked.retry_at is not None and provider.status().held and at < 1
    )  # parked at once, waiting for nothing
    [held] = [e for e in heard if isinstance(e, ProviderHoldSet)]
    assert held.provider == "pooled"


def test_a_failed_call_tries_another_key_at_once_and_keeps_its_backoff_on_the_first() -> None:
    """A 503 under key A: the call's retry goes under B without waiting out A's backoff."""

    def answer(key: str, n: int) -> Any:
        if key == "A":
            raise pb.ToolError("service unavailable", status=503, retryable=True)
        return key

    provider = pb.Provider("pooled", keys=keys("A", "B"))
    upstream = Upstream(answer, latency=0.0)
    answers, elapsed = run_virtual(many(provider, upstream, 1))
    assert answers == ["B"] and upstream.calls == {"A": 1, "B": 1} and elapsed < 0.1


# -- refused and down keys ---------------------------------------------------------------------


def test_a_refused_key_retires_for_the_run_and_every_key_refused_is_fatal() -> None:
    """401 under B: B retires (one KeyRetired, naming its variable and last characters), its
    calls go on under A and C.  Then A and C refused too: RunFatal naming every key.  A new run
    (retest) takes all three again."""
    refused: set[str] = {"B"}

    def answer(key: str, n: int) -> Any:
        if key in refused:
            raise pb.RunFatal(f"HTTP 401 for {key}", status=401)
        return key

    provider = pb.Provider("pooled", keys=keys("A", "B", "C"), concurrency=4)
    upstream = Upstream(answer)
    heard: list[Any] = []

    async def main() -> tuple[list[Any], list[Any]]:
        gov = governor(provider)
        gov.subscribe(heard.append)
        first, _ = await many(provider, upstream, 30)
        refused.update({"A", "C"})
        later, _ = await many(provider, upstream, 3)
        return first, later

    first, later = run_virtual(main())
    assert not [a for a in first if isinstance(a, BaseException)] and set(first) == {"A", "C"}
    retired, *others = [e for e in heard if isinstance(e, KeyRetired)]
    assert [e.left for e in others] == [1, 0]
    assert retired.key == "T_KEY_B …B002" and retired.left == 2 and ENV["T_KEY_B"] not in retired.said()
    assert all(isinstance(a, pb.RunFatal) for a in later)
    message = str(later[0])
    assert "no key is left to call with" in message and all(f"T_KEY_{k}" in message for k in "ABC")
    assert [s.retired for s in provider.status().keys] == ["HTTP 401"] * 3
    governor(provider).retest()
    assert [s.retired for s in provider.status().keys] == [None] * 3


def test_a_run_that_starts_while_another_uses_the_pool_keeps_out_the_key_refused_under_it() -> None:
    """Two runs share the process's pool (a Dask worker's partitions): B refused under the first
    stays out when the second starts, so each run that starts does not pay B's refusal again;
    once no run uses the pool, the next run takes B back (it may have been renewed)."""
    provider = pb.Provider("pooled", keys=keys("A", "B", "C"), concurrency=4)
    refused = {"B"}

    def answer(key: str, n: int) -> Any:
        if key in refused:
            raise pb.RunFatal(f"HTTP 401 for {key}", status=401)
        return key

    upstream = Upstream(answer)

    async def main() -> tuple[int, list[str | None], list[str | None]]:
        first = watch(provider, lambda event: None)
        await many(provider, upstream, 12)
        second = watch(provider, lambda event: None)  # a second run starts while the first goes on
        before = upstream.calls["B"]
        await many(provider, upstream, 12)
        refusals = upstream.calls["B"] - before
        kept = [s.retired for s in provider.status().keys]
        first(), second()
        watch(provider, lambda event: None)  # the next run, alone
        return refusals, kept, [s.retired for s in provider.status().keys]

    refusals, kept, later = run_virtual(main())
    assert refusals == 0 and kept == [None, "HTTP 401", None]
    assert later == [None, None, None]


def test_calls_waiting_for_a_refused_keys_slots_go_under_another_key_and_none_is_sent_with_it() -> None:
    """Key B is revoked after 2 calls while 50 more wait for its rate slots: none of them is sent
    with B (one unpaid 401 for the call already out, not one per call queued), and they do not
    wait out B's queue first."""

    def answer(key: str, n: int) -> Any:
        if key == "B" and n > 2:
            raise pb.RunFatal("HTTP 401", status=401)
        return key

    provider = pb.Provider("pooled", keys=keys("A", "B"), rps=10, burst=1)
    upstream = Upstream(answer)
    answers, elapsed = run_virtual(many(provider, upstream, 100))
    assert not [a for a in answers if isinstance(a, BaseException)]
    assert upstream.calls["B"] == 3, upstream.calls  # 2 answered, 1 refused
    assert elapsed <= 100 / 9.8 + 1  # A's pace for the rest, with no detour through B's queue


def test_a_key_whose_variable_is_not_set_here_leaves_its_calls_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker without one key's variable: that key is out of the pool (said once), the others
    carry its calls; with no key set at all, the run stops, naming each variable."""
    monkeypatch.delenv("T_KEY_B")
    provider = pb.Provider("pooled", keys=keys("A", "B"), concurrency=4)
    upstream = Upstream()
    heard: list[Any] = []

    async def main() -> list[Any]:
        governor(provider).subscribe(heard.append)
        answers, _ = await many(provider, upstream, 10)
        return answers

    assert run_virtual(main()) == ["A"] * 10
    [retired] = [e for e in heard if isinstance(e, KeyRetired)]
    assert retired.key == "T_KEY_B" and "its variable is not set here" in retired.said()
    monkeypatch.delenv("T_KEY_A")
    governor(provider).retest()
    [fatal] = run_virtual(many(provider, upstream, 1))[0]
    assert isinstance(fatal, pb.RunFatal) and "T_KEY_A" in str(fatal) and "T_KEY_B" in str(fatal)


def test_a_key_that_is_down_leaves_its_calls_to_the_others_and_the_provider_is_up() -> None:
    """Key A's endpoint refuses connections: A goes down, every call is answered under B, and the
    provider is not down (no ProviderDown) until B is down too."""
    dead = {"A"}

    def answer(key: str, n: int) -> Any:
        if key in dead:
            raise ConnectionError("connection refused")
        return key

    provider = pb.Provider("pooled", keys=keys("A", "B"), concurrency=8)
    upstream = Upstream(answer)
    heard: list[Any] = []

    async def main() -> tuple[list[Any], bool, bool]:
        gov = governor(provider)
        gov.subscribe(heard.append)
        answers, _ = await many(provider, upstream, 60)
        a_down = provider.status().keys[0].down
        dead.add("B")
        await many(provider, upstream, 20, max_wait=1)
        return answers, a_down, provider.status().down

    answers, a_down, both_down = run_virtual(main())
    assert set(answers) == {"B"} and len(answers) == 60 and a_down
    assert both_down and len([e for e in heard if isinstance(e, ProviderDown)]) == 1


def test_an_announced_limit_is_the_keys_that_announced_it() -> None:
    async def send() -> str:
        governor(provider).learn(
            Announced(requests=120)
        )  # what an LLM answer's x-ratelimit-limit-requests says
        return "ok"

    provider = pb.Provider("pooled", keys=keys("A", "B"))
    run_virtual(governor(provider).dispatch(send, ticket()))
    rates = [s.rate for s in provider.status().keys]
    assert sorted(rates, key=lambda r: r is None) == [pytest.approx(2 * 0.98), None]


# -- what it says -----------------------------------------------------------------------------


def test_a_pool_shows_a_line_per_key_with_the_key_masked() -> None:
    def answer(key: str, n: int) -> Any:
        if key == "B":
            raise pb.RunFatal("HTTP 401", status=401)
        return key

    provider = pb.Provider("pooled", keys=keys("A", "B"), rps=[5, 7])
    run_virtual(many(provider, Upstream(answer), 4))
    status = provider.status()
    assert [s.name for s in status.keys] == ["T_KEY_A …A001", "T_KEY_B …B002"]
    assert status.rate == pytest.approx(5 * 0.98) and status.keys[1].rate == pytest.approx(
        7 * 0.98
    )  # the keys in use
    table = providers_table({"pooled": status}, {})
    assert "└ key T_KEY_A …A001" in table and "retired (HTTP 401) for this run" in table
    assert not any(value in table or value in repr(provider) for value in ENV.values())
    assert "keys=2" in repr(provider)


def test_equal_pools_share_one_state_and_travel_as_their_description() -> None:
    provider = pb.Provider("pooled", keys=keys("A", "B"), rps=[5, 7])
    assert governor(pb.Provider("pooled", keys=keys("A", "B"), rps=[5, 7])) is governor(provider)
    assert governor(pb.Provider("pooled", keys=keys("B", "A"), rps=[7, 5])) is not governor(provider)
    copy = pickle.loads(pickle.dumps(provider))
    assert governor(copy) is governor(provider) and copy.keys == provider.keys and copy.rps == (5, 7)
    with sharing_limits("redis://127.0.0.1:1/0"):
        shared = pickle.loads(pickle.dumps(provider))
    assert shared.shared == "redis://127.0.0.1:1/0" and shared.keys == provider.keys


# -- bad definitions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"keys": "sk-live-123"}, "keys must be a list of pb.secret('ENV_VAR')"),
        ({"keys": []}, "keys must be a list of pb.secret('ENV_VAR')"),
        ({"keys": [pb.secret("T_KEY_A"), "sk-live-123"]}, "keys[1] must come from pb.secret('ENV_VAR')"),
        ({"keys": [pb.secret("T_KEY_A"), pb.secret("T_KEY_A")]}, "keys[1] names T_KEY_A again"),
        ({"rps": [10, 20]}, "rps is a list ([10, 20]), one per key, but no keys= were given"),
        (
            {"keys": [pb.secret("T_KEY_A"), pb.secret("T_KEY_B")], "rpm": [100, 200, 300]},
            "rpm has 3 values for 2 keys",
        ),
        (
            {"keys": [pb.secret("T_KEY_A"), pb.secret("T_KEY_B")], "tpm": [100, -1]},
            "tpm must be a finite number > 0",
        ),
        (
            {"keys": [pb.secret("T_KEY_A"), pb.secret("T_KEY_B")], "window": [(5, 1)]},
            "window has 1 values for 2 keys",
        ),
        (
            {"keys": [pb.secret("T_KEY_A"), pb.secret("T_KEY_B")], "retries": [1, 2]},
            "retries is the provider's, one number for all",
        ),
        (
            {"keys": [pb.secret("T_KEY_A"), pb.secret("T_KEY_B")], "rps": [1, 2], "rpm": [60, 120]},
            "(rps=[1, 2], rpm=[60, 120])",
        ),
    ],
)
def test_a_bad_pool_is_refused_naming_the_option(options: dict[str, Any], said: str) -> None:
    with pytest.raises(pb.PlayDefinitionError) as caught:
        pb.Provider("pooled", **options)
    assert said in str(caught.value) and "sk-live-123" not in str(caught.value)


def test_keys_and_per_key_limits_come_in_any_sequence() -> None:
    import numpy as np
    import pandas as pd
    import polars as pl

    pooled = pb.Provider("p", keys=(pb.secret(f"T_KEY_{n}") for n in "AB"), rps=np.array([10, 30]))
    assert pooled.keys == tuple(keys("A", "B")) and pooled.rps == (10.0, 30.0)
    limits = pd.DataFrame({"rps": [5, 15], "tpm": [1_000, 3_000], "windows": [(50, 5), (150, 5)]})
    pooled = pb.Provider(
        "p", keys=keys("A", "B"), rps=limits["rps"], tpm=pl.Series([1_000, 3_000]), window=limits["windows"]
    )
    assert (
        pooled.rps == (5.0, 15.0)
        and pooled.tpm == (1_000.0, 3_000.0)
        and pooled.window == ((50, 5.0), (150, 5.0))
    )
    with pytest.raises(pb.PlayDefinitionError, match="max_wait is the provider's"):
        pb.Provider("p", keys=keys("A", "B"), max_wait=pd.Series([1.0, 2.0]))


def test_one_key_named_by_two_variables_is_paced_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """T_KEY_B holds the same value as T_KEY_A: B leaves the pool at the run's start (saying why),
    so the key is not sent at twice its rate."""
    monkeypatch.setenv("T_KEY_B", ENV["T_KEY_A"])
    provider = pb.Provider("pooled", keys=keys("A", "B", "C"))
    heard: list[Any] = []
    gov = governor(provider)
    gov.subscribe(heard.append)
    gov.retest()  # what each run does as it starts
    assert [s.retired for s in provider.status().keys] == [None, "the same key as T_KEY_A", None]
    assert [e.why for e in heard if isinstance(e, KeyRetired)] == ["the same key as T_KEY_A"]


def test_per_key_windows_are_told_from_one_window() -> None:
    assert pb.Provider("p", window=(50, 5)).window == (50, 5.0)
    pooled = pb.Provider("p", keys=keys("A", "B"), window=[(50, 5), (100, 5)])
    assert pooled.window == ((50, 5.0), (100, 5.0))


def test_tools_on_a_pool_send_its_keys_and_no_key_of_their_own() -> None:
    pool = pb.Provider("pooled", keys=keys("A", "B"))
    with pytest.raises(pb.PlayDefinitionError, match="drop secret="):
        pb.http_tool(
            "t",
            method="GET",
            url="https://x.test/{q}",
            headers={"Authorization": "Bearer {secret}"},
            secret=pb.secret("X"),
            provider=pool,
        )
    with pytest.raises(pb.PlayDefinitionError, match="no template uses '\\{secret\\}'"):
        pb.http_tool("t", method="GET", url="https://x.test/{q}", provider=pool)
    with pytest.raises(pb.PlayDefinitionError, match="a Python tool cannot be told which key"):
        pb.tool(lambda q: q, name="t", provider=pool)
    with pytest.raises(pb.PlayDefinitionError, match="drop secret="):
        pb.llm_tool(model="m", secret=pb.secret("X"), provider=pool)
    with pytest.raises(pb.PlayDefinitionError, match="mode='batch' needs a provider with one key"):
        pb.llm_tool(model="m", provider=pool, mode="batch")
    pb.http_tool(
        "t", method="GET", url="https://x.test/{q}", params={"key": "{secret}"}, provider=pool
    )  # fine
    assert engine_of(pb.llm_tool(model="m", provider=pool)).endpoint.headers == {
        "Authorization": "Bearer {secret}"
    }
