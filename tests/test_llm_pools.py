"""LLM tools over several keys and several models, against the demo's OpenAI-compatible endpoint.

* One model, several keys: ``llm_tool(provider=pb.Provider(..., keys=[...], rpm=...))`` sends each
  call's key as its bearer token, paces each key under its own limits, and keeps one receipt per
  call whichever key answered.
* Several models: fallbacks are a waterfall of LLM tools (``ctx.waterfall``).  A model that is
  down, or held past the wait budget, falls through to the next; each model's receipts are its
  own; ``with_source=True`` says which model answered each row.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from vtime import run_virtual

import playbook as pb

KEYS = {"LLM_KEY_A": "llm-key-aaaa-0001", "LLM_KEY_B": "llm-key-bbbb-0002"}
MODEL = "gpt-4o-mini"


@pytest.fixture
def keyed(demo: pb.demo.DemoServer, monkeypatch: pytest.MonkeyPatch) -> pb.demo.DemoServer:
    for env, value in KEYS.items():
        monkeypatch.setenv(env, value)
    demo.reset(api_keys=tuple(KEYS.values()))
    return demo


def _rows(n: int) -> pd.DataFrame:
    return pd.DataFrame({"company": [f"Company {i} Labs" for i in range(n)]})


def _ok(demo: pb.demo.DemoServer, env: str) -> int:
    return int(demo.stats()["by_key"].get("…" + KEYS[env][-4:], {}).get("ok", 0))


def test_an_llm_tool_on_a_pool_sends_each_calls_key_and_paces_each_key_on_its_own(
    keyed: pb.demo.DemoServer, tmp_path: Any
) -> None:
    """Two keys of 300 requests a minute each (the demo enforces them per key): every call is
    answered, under both keys, with few refusals; a rerun with the keys listed the other way
    round sends nothing."""
    demo = keyed
    demo.reset(api_keys=tuple(KEYS.values()), chat_rpm=300)
    keys = [pb.secret("LLM_KEY_A"), pb.secret("LLM_KEY_B")]
    llm = pb.llm_tool(
        model=MODEL, base_url=demo.url + "/v1", provider=pb.Provider("llm-pool", keys=keys, rpm=300)
    )

    async def summary(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"summary": await ctx.tool(llm, prompt=f"Summarise {row.company}.")}

    # The pace's seconds pass in virtual time, on the demo's clock too.
    out = run_virtual(_rows(40).play.amap(pb.play(summary), store=tmp_path / "s", progress=False))
    assert out["play_status"].eq("ok").all() and out["summary"].str.len().gt(0).all()
    assert (
        _ok(demo, "LLM_KEY_A") + _ok(demo, "LLM_KEY_B") == 40
        and min(_ok(demo, "LLM_KEY_A"), _ok(demo, "LLM_KEY_B")) >= 10
    )
    assert sum(demo.stats()["chat_rate_limited"].values()) <= 4
    sent = demo.stats()["requests"]
    swapped = pb.llm_tool(
        model=MODEL, base_url=demo.url + "/v1", provider=pb.Provider("llm-pool", keys=keys[::-1], rpm=300)
    )

    async def again(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"again": await ctx.tool(swapped, prompt=f"Summarise {row.company}.")}

    second = run_virtual(_rows(40).play.amap(pb.play(again), store=tmp_path / "s", progress=False))
    assert second["again"].tolist() == out["summary"].tolist() and demo.stats()["requests"] == sent


def _fallbacks(primary: pb.Tool, fallback: pb.Tool) -> pb.Play:
    async def answer(row: Any, ctx: pb.Context) -> dict[str, Any]:
        prompt = f"Summarise {row.company}."
        text, model = await ctx.waterfall(
            "answer", [ctx.leg(primary, prompt=prompt), ctx.leg(fallback, prompt=prompt)], with_source=True
        )
        return {"answer": text, "model": model}

    return pb.play(answer, name="answer")


def test_a_model_that_is_down_falls_through_to_the_next_and_the_row_says_which_answered(
    keyed: pb.demo.DemoServer, tmp_path: Any
) -> None:
    """The primary model's endpoint refuses connections: every row is answered by the fallback,
    says so, and the waterfall's counts show the primary unavailable; a rerun sends nothing."""
    demo = keyed
    primary = pb.llm_tool(
        "primary",
        model="gpt-4o",
        base_url="http://127.0.0.1:9/v1",
        secret=pb.secret("LLM_KEY_A"),
        provider=pb.Provider("primary-down", max_wait=5),
    )
    fallback = pb.llm_tool(
        "fallback",
        model=MODEL,
        base_url=demo.url + "/v1",
        secret=pb.secret("LLM_KEY_B"),
        provider=pb.Provider("fallback"),
    )
    run = _rows(12).play.run(_fallbacks(primary, fallback), store=tmp_path / "s", progress=False)
    out = run.result
    assert (
        out["play_status"].eq("ok").all()
        and set(out["model"]) == {"fallback"}
        and out["answer"].str.len().gt(0).all()
    )
    legs = run.waterfalls.set_index("tool")
    assert legs.loc["primary", "unavailable"] == 12 and legs.loc["fallback", "hits"] == 12
    assert _ok(demo, "LLM_KEY_B") == 12
    sent = demo.stats()["requests"]
    rerun = _rows(12).play.map(_fallbacks(primary, fallback), store=tmp_path / "s", progress=False)
    assert rerun["play_status"].eq("reused").all() and demo.stats()["requests"] == sent


def test_a_model_held_past_the_wait_budget_falls_through_and_each_model_keeps_its_own_receipts(
    keyed: pb.demo.DemoServer, tmp_path: Any
) -> None:
    """The primary model's key is out of its daily quota (429, Retry-After a day): past max_wait it
    falls through to the fallback at once, and the provider is asked by the first calls only, not per row.
    A rerun replays each row's answer as first returned."""
    demo = keyed
    demo.reset(api_keys=tuple(KEYS.values()), quota=0, quota_keys=(KEYS["LLM_KEY_A"],), quota_reset=86400)
    primary = pb.llm_tool(
        "primary",
        model="gpt-4o",
        base_url=demo.url + "/v1",
        secret=pb.secret("LLM_KEY_A"),
        provider=pb.Provider("primary-held", max_wait=30),
    )
    fallback = pb.llm_tool(
        "fallback",
        model=MODEL,
        base_url=demo.url + "/v1",
        secret=pb.secret("LLM_KEY_B"),
        provider=pb.Provider("fallback-2"),
    )
    out = _rows(30).play.map(_fallbacks(primary, fallback), store=tmp_path / "s", progress=False)
    assert out["play_status"].eq("ok").all() and set(out["model"]) == {"fallback"}
    assert _ok(demo, "LLM_KEY_A") == 0 and _ok(demo, "LLM_KEY_B") == 30
    # Held from the first refusal on: only the calls already on their way (the first few in flight) were refused.
    assert demo.stats()["by_key"]["…" + KEYS["LLM_KEY_A"][-4:]]["quota_exceeded"] <= 9
    again = _rows(30).play.map(_fallbacks(primary, fallback), store=tmp_path / "s", progress=False)
    assert again["answer"].tolist() == out["answer"].tolist()  # replayed as first returned


def test_a_gemini_key_refused_retires_from_its_pool_and_the_run_goes_on(
    keyed: pb.demo.DemoServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemini refuses a bad key with 400 API_KEY_INVALID, not 401: in a pool it retires that key
    as a 401 does (a warning naming its variable) and every row is answered under the other."""
    monkeypatch.setenv("LLM_KEY_B", "llm-key-not-valid-9999")
    keys = [pb.secret("LLM_KEY_A"), pb.secret("LLM_KEY_B")]
    llm = pb.llm_tool(
        model="gemini-2.5-flash", api="gemini", base_url=keyed.url, provider=pb.Provider("g", keys=keys)
    )

    async def summary(row: Any, ctx: pb.Context) -> dict[str, Any]:
        return {"summary": await ctx.tool(llm, prompt=f"Summarise {row.company}.")}

    out = run_virtual(_rows(10).play.amap(pb.play(summary), store=tmp_path / "s", progress=False))
    assert out["play_status"].eq("ok").all() and _ok(keyed, "LLM_KEY_A") == 10
    assert any("LLM_KEY_B" in notice and "HTTP 400" in notice for notice in pb.last_run().notices)
