"""The LLM promises in every dialect an LLM tool speaks (``pb.llm_tool(api=...)``), on every engine:
structured output lands in typed columns, each distinct call is paid once however many rows and
processes ask it, what it cost is the provider's usage at the given prices, a rerun sends nothing
and returns exactly what the first run did, and the key goes only where that dialect puts it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
from engines import Engine
from exact import same
from promises import DIALECTS, KEY_PLACES, LLM_KEY, aws_env, dialect_tool, people, verdict_model

import playbook as pb
from playbook.demo.settings import DEMO_KEY

PRICES = (0.15, 0.60)  # per 1M input and output tokens


@pytest.fixture(params=DIALECTS)
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _served(demo: Any, api: str) -> dict[str, Any]:
    return dict(demo.stats()["by_api"].get(api) or {"requests": 0, "input_tokens": 0, "output_tokens": 0})


def test_every_dialect_fills_typed_columns_pays_each_call_once_and_replays_it_exactly(
    engine: Engine, demo: Any, name: Callable[[str], str], api: str
) -> None:
    """24 rows asking 12 distinct questions with ``output=`` a model, in each dialect: every row
    gets its fields as typed columns, the provider answers 12 requests, the run costs its usage at
    the prices given, and a rerun sends no request and returns the same values."""
    engine.setenv(LLM_KEY, DEMO_KEY)
    for var, value in aws_env(DEMO_KEY).items():
        engine.setenv(var, value)
    llm = dialect_tool(
        demo,
        api,
        name("llm"),
        output=verdict_model(),
        prices={"demo-mini": PRICES},
        provider=pb.Provider(name(api), concurrency=4),
    )

    async def verdict(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify company {row.n % 12} of {row.domain}")

    play = pb.play(verdict, name="verdict", output=verdict_model())
    first = engine.run(people(24, calls=12), play, concurrency=4)
    assert first.statuses == {"ok": 24}, (
        first.fatal,
        first.result["play_error"].dropna().head(3).tolist() if first.result is not None else None,
    )
    served = _served(demo, api)
    assert served["requests"] == 12, served
    result = first.result
    assert result is not None
    for column in ("industry", "summary"):
        assert pd.api.types.is_string_dtype(result[column]), result.dtypes
        assert result[column].str.len().min() > 0
    billed = (served["input_tokens"] * PRICES[0] + served["output_tokens"] * PRICES[1]) / 1e6
    assert billed > 0 and first.total("cost_spent") == pytest.approx(billed, rel=1e-9)
    assert first.total("tokens") == served["input_tokens"] + served["output_tokens"]

    again = engine.run(people(24, calls=12), play, concurrency=4)
    assert _served(demo, api)["requests"] == 12 and again.total("cost_spent") == 0
    assert again.result is not None
    for column in ("industry", "summary"):
        assert same(again.result[column].tolist(), result[column].tolist())


def test_every_dialect_sends_its_key_only_where_that_dialect_puts_it(
    engine: Engine, demo: Any, name: Callable[[str], str], api: str
) -> None:
    """Prompts that hold the key's own text, in each dialect: the key reaches the provider in that
    dialect's header alone (Bedrock's access key id in its SigV4 signature), never in a body, a
    path or a query."""
    engine.setenv(LLM_KEY, DEMO_KEY)
    for var, value in aws_env(DEMO_KEY).items():
        engine.setenv(var, value)
    llm = dialect_tool(demo, api, name("llm"), provider=pb.Provider(name(api), concurrency=4))
    frame = pd.DataFrame({"q": [f"row {i}: the key is {{secret}} or {DEMO_KEY}" for i in range(8)]})

    async def ask(row: Any, ctx: pb.Context) -> Any:
        return {"said": await ctx.tool(llm, prompt=row.q)}

    out = engine.run(frame, pb.play(ask, name="ask"), concurrency=4)
    assert out.statuses == {"ok": 8}, (
        out.result["play_error"].dropna().tolist() if out.result is not None else out
    )
    stats = demo.stats()
    place = KEY_PLACES[api]
    # The demo finds its key wherever a request carries it; the prompts' copies are the row's own
    # text, in the body, and are the only other place it may be.
    places = {k: v for k, v in stats["key_places"].items() if k != "body"}
    assert places == {place: stats["requests"]}, stats["key_places"]


@pytest.mark.parametrize("batched", ["openai", "anthropic", "gemini"])
def test_every_batch_dialect_sends_each_call_once_in_a_batch_and_a_rerun_sends_nothing(
    engine: Engine, demo: Any, name: Callable[[str], str], batched: str
) -> None:
    """mode="batch" in each dialect whose provider takes batches: 24 rows asking 12 distinct questions go out in batch jobs, each
    question in one batch once however many processes ask it, every row gets its typed fields at half the prices given, and a rerun
    sends no request and returns the same values."""
    engine.setenv(LLM_KEY, DEMO_KEY)
    demo.reset(batch_seconds=1.0)
    llm = dialect_tool(
        demo, batched, name("llm"), output=verdict_model(), prices={"demo-mini": PRICES}, mode="batch"
    )

    async def verdict(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify company {row.n % 12} of {row.domain}")

    play = pb.play(verdict, name="verdict", output=verdict_model())
    first = engine.run(people(24, calls=12), play, concurrency=4)
    assert first.statuses == {"ok": 24}, (
        first.fatal,
        first.result["play_error"].dropna().head(3).tolist() if first.result is not None else None,
    )
    served = demo.stats()
    usage = served["chat_batch"]["demo-mini"]
    assert usage["requests"] == 12 and served["batches_created"] >= 1, served["chat_batch"]
    billed = (usage["prompt_tokens"] * PRICES[0] + usage["completion_tokens"] * PRICES[1]) / 1e6 / 2
    assert billed > 0 and first.total("cost_spent") == pytest.approx(billed, rel=1e-9)
    result = first.result
    assert result is not None

    requests = served["requests"]
    again = engine.run(people(24, calls=12), play, concurrency=4)
    assert demo.stats()["requests"] == requests and again.total("cost_spent") == 0
    assert again.result is not None
    for column in ("industry", "summary"):
        assert same(again.result[column].tolist(), result[column].tolist())
