"""The parts of LLM tools that need no server: strict schemas, the headers providers announce
limits in, weighing and pricing a call, and the errors a user meets defining or calling one."""

from __future__ import annotations

import math
import sys
from typing import Literal

import pandas as pd
import pydantic
import pytest

import playbook as pb
from playbook.providers.limits import Announced, Rates, announced, duration, retry_after
from playbook.providers.limits.local import LocalLimiter
from playbook.providers.provider import governor
from playbook.tools import engine_of
from playbook.tools.llm import LlmEngine
from playbook.tools.llm.structured import Structured, strict_schema
from playbook.tools.protocol import NO_INPUT


class Address(pydantic.BaseModel):
    city: str
    country: str | None = None


class Company(pydantic.BaseModel):
    name: str
    industry: Literal["Software", "Retail"]
    employees: int | None = None
    default: str = "a field named like a keyword"
    offices: list[Address] = []


def _objects(node: object) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append(node)
        for value in node.values():
            found.extend(_objects(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_objects(value))
    return found


def test_a_strict_schema_closes_every_object_and_requires_every_property() -> None:
    """Strict mode: additionalProperties false and all properties required, nested ($defs) too; defaults go, fields named 'default' stay."""
    schema = strict_schema(Company.model_json_schema())
    objects = _objects(schema)
    assert len(objects) == 2
    for obj in objects:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])  # type: ignore[call-overload]
    assert "default" in schema["properties"]
    assert "default" not in schema["properties"]["employees"]
    assert "$ref" in str(schema["properties"]["offices"])


def test_an_answer_is_read_into_the_models_fields_or_says_why_not() -> None:
    """Valid JSON for the model gives its fields as a dict; bad JSON or a wrong field gives the reason, naming the field."""
    structured = Structured(Company, "llm_tool 'x'")
    fields, why = structured.parse(
        '{"name": "Acme", "industry": "Retail", "employees": 12, "default": "d", "offices": []}'
    )
    assert why is None and fields == {
        "name": "Acme",
        "industry": "Retail",
        "employees": 12,
        "default": "d",
        "offices": [],
    }
    assert structured.parse('{"name": "Acme"')[1].startswith("the answer is not valid JSON")  # type: ignore[union-attr]
    _, why = structured.parse(
        '{"name": "Acme", "industry": "Mining", "employees": 1, "default": "d", "offices": []}'
    )
    assert why is not None and "'industry'" in why


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1.5s", 1.5),
        ("20ms", 0.02),
        ("1h2m3s", 3723.0),
        ("0.25", 0.25),
        ("abc", None),
        ("5x", None),
        ("", None),
    ],
)
def test_reset_durations_read_as_providers_write_them(text: str, seconds: float | None) -> None:
    """'6m0s', '1.5s', '20ms' and bare numbers are seconds; anything else is not trusted."""
    assert duration(text) == seconds


def test_limits_announced_in_headers_are_read_and_garbage_is_not() -> None:
    """x-ratelimit-limit-requests/-tokens are per-minute limits; missing or garbage values are None."""
    assert announced({"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000"}) == (
        Announced(requests=500.0, tokens=30000.0)
    )
    assert announced({"x-ratelimit-limit-tokens": "200000"}) == Announced(tokens=200000.0)
    assert announced({"x-ratelimit-limit-requests": "lots"}) is None
    assert announced({}) is None


def test_what_anthropics_buckets_hold_is_read_zero_included_and_openais_is_not() -> None:
    """anthropic-ratelimit-input/output-tokens-remaining are what each bucket holds (0: used up);
    OpenAI's x-ratelimit-remaining-tokens is not read as a level."""
    headers = {
        "anthropic-ratelimit-input-tokens-limit": "20000",
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-remaining": "2500",
    }
    assert announced(headers) == Announced(input=20000.0, remaining=Rates(None, 0.0, 2500.0))
    assert announced({"anthropic-ratelimit-output-tokens-remaining": "-3"}) is None
    assert announced({"x-ratelimit-remaining-tokens": "100"}) is None


def test_a_refusal_without_retry_after_waits_for_the_used_up_limit_to_reset() -> None:
    """retry-after-ms first; without any Retry-After, the reset of the limit whose remaining is 0."""
    assert retry_after({"retry-after-ms": "250", "retry-after": "1"}, now=0.0) == 0.25
    headers = {
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "1.5s",
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "6m0s",
    }
    assert retry_after(headers, now=0.0) == 1.5


def test_a_call_is_weighed_and_priced_before_it_is_sent() -> None:
    """Tokens are estimated from characters (4 a token until answers teach better) plus the expected completion; the cost from prices."""
    llm = engine_of(
        pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1", max_tokens=100, prices={"m": (1.0, 2.0)})
    )
    values = llm.bind(NO_INPUT, {"prompt": "x" * 400})
    assert llm.weigh(values) == math.ceil(
        100 + 4 + 64
    )  # 400 chars / 4, 4 per message, 64 expected (under max_tokens)
    assert llm.price(values) == pytest.approx(
        (104 * 1.0 + 64 * 2.0) / 1e6
    )  # the usual completion, not the cap
    spent = llm.spent({"usage": {"prompt_tokens": 120, "completion_tokens": 30}, "requests": 2})
    assert spent == (pytest.approx((120 * 1.0 + 30 * 2.0) / 1e6), 150.0, 2, 0.0, None)
    # A batch job's answer: half the price, what it would have cost online beside it.
    batched = llm.spent({"usage": {"prompt_tokens": 120, "completion_tokens": 30}, "batch": True})
    assert (batched.cost, batched.online) == (pytest.approx(spent.cost / 2), pytest.approx(spent.cost))
    # A re-asked answer: the first request's usage, which bought an answer validation refused, apart.
    spent = llm.spent(
        {
            "usage": {"prompt_tokens": 120, "completion_tokens": 30},
            "requests": 2,
            "refused_usage": {"prompt_tokens": 50, "completion_tokens": 10},
        }
    )
    assert spent.refused == pytest.approx((50 * 1.0 + 10 * 2.0) / 1e6)


def test_answers_teach_the_characters_per_token() -> None:
    """After a few hundred prompt tokens, the estimate uses the ratio the provider's usage shows."""
    llm = engine_of(pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1"))
    assert isinstance(llm, LlmEngine)
    llm.usage.add(1000, {"prompt_tokens": 500, "completion_tokens": 10})
    values = llm.bind(NO_INPUT, {"prompt": "y" * 200})
    assert llm.weigh(values) == math.ceil(200 / 2 + 4 + 10)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"model": ""}, "model must be"),
        ({"model": "m", "base_url": "api.openai.com"}, "base_url must be"),
        ({"model": "m", "secret": "sk-123"}, "pb.secret"),
        ({"model": "m", "prices": {"other": (1, 2)}}, "no entry for model 'm'"),
        ({"model": "m", "prices": {"m": (1,)}}, "prices['m'] must be"),
        ({"model": "m", "output": int}, "output= takes a pydantic model class or a TypedDict class"),
        ({"model": "m", "temperature": 3}, "temperature"),
        ({"model": "m", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "mode": "async"}, "mode must be"),
        ({"model": "m", "messages": []}, "set by the tool itself"),
    ],
)
def test_a_bad_definition_is_refused_naming_the_option(options: dict[str, object], words: str) -> None:
    """Each bad llm_tool option raises PlayDefinitionError naming the tool and the option."""
    with pytest.raises(pb.PlayDefinitionError, match="llm_tool 'llm'") as raised:
        pb.llm_tool(**options)  # type: ignore[arg-type]
    assert words in str(raised.value)


def test_a_bad_prompt_fails_its_row_naming_the_tool_and_pays_nothing(tmp_path: object) -> None:
    """A missing prompt (NaN) or malformed messages fail that row with the tool named; no request is sent."""
    llm = pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1", secret=None)

    async def ask(row: object, ctx: pb.Context) -> object:
        if row["kind"] == "prompt":  # type: ignore[index]
            return await ctx.tool(llm, prompt=row["text"])  # type: ignore[index]
        return await ctx.tool(llm, messages=[{"role": "robot", "content": "hi"}])

    df = pd.DataFrame({"kind": ["prompt", "messages"], "text": [float("nan"), "x"]})
    out = df.play.map(ask, progress=False)
    assert list(out.play_status) == ["failed", "failed"]
    assert "llm tool 'llm': prompt must be text, not NaN" in out.play_error[0]
    assert "messages[0] has role 'robot'; a role is one of assistant" in out.play_error[1]
    assert pb.last_run().stats.calls_executed == 0  # type: ignore[union-attr]


def test_a_token_limit_is_made_when_a_provider_first_announces_one() -> None:
    """A provider with no tpm that announces one is paced by it from then on; the panel reads it back."""
    provider = pb.Provider("llm-co")
    governor(provider).learn(Announced(600, 60000))
    limiter = governor(provider).limiter
    assert isinstance(limiter, LocalLimiter) and limiter.budgets is not None
    assert limiter.token_rate == pytest.approx(1000 * 0.98)
    assert provider.status().rate == pytest.approx(10 * 0.98)
    assert (provider.status().tokens, provider.status().tpm) == (0.0, pytest.approx(60000))


def test_the_receipt_key_is_the_request_model_messages_and_parameters() -> None:
    """Model, prompt, system, parameters and output schema change the key; prices and the key's secret do not."""
    base = {"model": "m", "base_url": "http://127.0.0.1:9/v1"}

    def key(prompt: str = "hi", **options: object) -> str:
        llm = engine_of(pb.llm_tool(**{**base, **options}))  # type: ignore[arg-type]
        return llm.address(llm.bind(NO_INPUT, {"prompt": prompt}))

    first = key()
    changed = [
        key("hello"),
        key(model="m2"),
        key(system="be brief"),
        key(temperature=0.5),
        key(max_tokens=9),
        key(top_p=0.5),
        key(output=Company),
        key(base_url="http://127.0.0.1:10/v1"),
    ]
    assert first not in changed and len(set(changed)) == len(changed)
    assert key(prices={"m": (1, 2)}) == first == key(secret=pb.secret("ANOTHER_KEY"))
    llm = engine_of(pb.llm_tool(**base))  # type: ignore[arg-type]
    as_messages = llm.address(llm.bind(NO_INPUT, {"messages": [{"role": "user", "content": "hi"}]}))
    assert as_messages == first  # a prompt is one user message


def test_the_panel_shows_tokens_per_minute_against_the_limit() -> None:
    """A provider's rate cell adds the last minute's tokens and the limit, when calls are weighed."""
    from playbook.runtime.state.upstream import ProviderView
    from playbook.ui.html import provider_rate

    view = ProviderView("openai", False, None, 0.0, False, 0.0, None, 9.8, 8, 3, 0, 28_400.0, 30_000.0)
    assert provider_rate(view) == "9.8/s, ≤8 in flight, 28.4k of 30k tokens/min"
    assert provider_rate(view._replace(tokens=0.0, tpm=None)) == "9.8/s, ≤8 in flight"
    assert (
        provider_rate(view._replace(tokens=950.0, tpm=None, in_flight_limit=None)) == "9.8/s, 950 tokens/min"
    )


def test_a_refusal_is_a_miss_and_a_plain_answer_is_its_text() -> None:
    """A model's refusal reads as a miss (None); without output= the answer is the message's text."""
    structured = engine_of(pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1", output=Company))
    assert structured.read({"content": None, "refusal": "I can't help with that", "requests": 1}, False) == (
        None,
        True,
    )
    plain = engine_of(pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1"))
    assert plain.read({"content": "Software", "refusal": None}, False) == ("Software", False)


def test_a_typeddict_output_works_and_one_pydantic_cannot_read_is_a_clear_error() -> None:
    """typing_extensions.TypedDict gives a strict schema; typing.TypedDict (refused by pydantic on 3.11) is a PlayDefinitionError."""
    import typing

    import typing_extensions

    class Row(typing_extensions.TypedDict):
        industry: str
        employees: int

    llm = engine_of(pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1", output=Row))
    assert isinstance(llm, LlmEngine)
    assert llm.structured is not None and llm.structured.schema["required"] == ["industry", "employees"]
    assert llm.read({"content": '{"industry": "Retail", "employees": 3}'}, False) == (
        {"industry": "Retail", "employees": 3},
        False,
    )

    class Plain(typing.TypedDict):
        industry: str

    if sys.version_info < (3, 12):
        with pytest.raises(
            pb.PlayDefinitionError,
            match="llm_tool .llm.: output=Plain cannot validate outputs: .*typing_extensions.TypedDict",
        ):
            pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1", output=Plain)
    with pytest.raises(pb.PlayDefinitionError, match="not an instance of Company"):
        pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1", output=Company(name="a", industry="Retail"))


def test_a_call_larger_than_a_minutes_tokens_fails_at_once_naming_the_limit() -> None:
    """A prompt weighing more than the provider's tpm fails its row at once: it could never be sent."""
    provider = pb.Provider("tiny", tpm=1_000)
    llm = pb.llm_tool(model="m", base_url="http://127.0.0.1:9/v1", provider=provider, secret=None)

    async def ask(row: object, ctx: pb.Context) -> object:
        return await ctx.tool(llm, prompt="word " * 2_000)

    out = pd.DataFrame({"n": [1]}).play.map(ask, progress=False)
    assert out.play_status[0] == "failed"
    assert (
        "this call needs about 2,5" in out.play_error[0]
        and "allows in a minute (1,000 tokens/min)" in out.play_error[0]
    )


def test_a_query_in_base_url_goes_with_every_request_after_the_path() -> None:
    """Azure's base_url ends in ?api-version=...: the request goes to .../chat/completions?api-version=..., and the version is in the key."""
    import httpx

    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        body = {
            "choices": [{"message": {"content": "Retail"}, "finish_reason": "stop"}],
            "model": "m",
            "usage": {"prompt_tokens": 5, "completion_tokens": 1},
        }
        return httpx.Response(200, json=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    base = "https://example.openai.azure.com/openai/v1?api-version=2024-10-21"
    llm = pb.llm_tool(model="m", base_url=base, secret=None, client=client)
    other = pb.llm_tool(model="m", base_url=base.replace("2024-10-21", "2025-01-01"), secret=None)

    async def ask(row: object, ctx: pb.Context) -> object:
        return await ctx.tool(llm, prompt="Classify Acme")

    out = pd.DataFrame({"n": [1]}).play.map(ask, progress=False)
    assert out.ask[0] == "Retail"
    assert seen == ["https://example.openai.azure.com/openai/v1/chat/completions?api-version=2024-10-21"]
    values = engine_of(llm).bind(NO_INPUT, {"prompt": "hi"})
    assert engine_of(llm).address(values) != engine_of(other).address(values)
