"""The demo's other LLM dialects, driven by each provider's official SDK: Anthropic Messages
(``anthropic``), Gemini generateContent (``google-genai``), OpenAI's Responses API and Azure
OpenAI (``openai``), Bedrock Converse (``botocore``), and the chat endpoint as a local server.

Each SDK parsing the demo's answers and refusals into its own types is the proof that the demo
speaks the dialect: a plain answer, a structured one, usage, a 429 as the SDK reads it, an
overload, Gemini's per-day quota, Azure's 10 s windows, the local server's 503 past its queue.

The provider is served in process on a frozen clock only the tests move, so windows and
buckets are exact; Bedrock's client (botocore, on urllib3) needs a socket, so it calls the
loopback server.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime

import httpx2
import pytest
from pydantic import BaseModel
from starlette.testclient import TestClient
from vtime import FrozenClock

from playbook import demo
from playbook.demo.api_gemini import json_schema, retry_delay

anthropic = pytest.importorskip("anthropic")
genai = pytest.importorskip("google.genai")
openai = pytest.importorskip("openai")

CLOCK = FrozenClock(6000.0)  # a multiple of 60 and 10: a fresh minute and a fresh 10 s window
PROMPT = "Classify this company: Acme Robotics"


class Company(BaseModel):
    name: str
    industry: str


@pytest.fixture(scope="module")
def server():
    with demo.serve(clock=CLOCK, in_process=True) as running:
        yield running


@pytest.fixture
def provider(server):
    server.reset()
    CLOCK.now = 6000.0
    return server


def _http(provider):
    return TestClient(provider.app, base_url=provider.url)


def _async_http(provider):
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=provider.app), base_url=provider.url)


def _anthropic(provider):
    return anthropic.Anthropic(
        api_key=demo.DEMO_KEY, base_url=provider.url, max_retries=0, http_client=_http(provider)
    )


def _gemini(provider):
    from google.genai import types

    options = types.HttpOptions(base_url=provider.url, httpx_client=_http(provider))
    return genai.Client(api_key=demo.DEMO_KEY, http_options=options)


def _openai(provider):
    return openai.OpenAI(
        api_key=demo.DEMO_KEY, base_url=provider.url + "/v1", max_retries=0, http_client=_http(provider)
    )


# -- the same question, the same answer in every dialect ------------------------------------------


def test_every_dialect_gives_the_same_answer_to_the_same_question(provider):
    """A question asked in chat completions, Responses, Anthropic, Gemini and Azure gets one answer."""
    with _openai(provider) as client:
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}])
        responses = client.responses.create(model="m", input=PROMPT)
    with _anthropic(provider) as client:
        message = client.messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": PROMPT}]
        )
    gemini = _gemini(provider).models.generate_content(model="m", contents=PROMPT)
    azure = openai.AzureOpenAI(
        api_key=demo.DEMO_KEY,
        api_version="2024-10-21",
        azure_endpoint=provider.url,
        max_retries=0,
        http_client=_http(provider),
    ).chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}])
    answers = {
        chat.choices[0].message.content,
        responses.output_text,
        message.content[0].text,
        gemini.text,
        azure.choices[0].message.content,
    }
    assert answers == {"Robotics"}
    assert (message.usage.input_tokens, message.usage.output_tokens) == (
        chat.usage.prompt_tokens,
        chat.usage.completion_tokens,
    )
    by_api = provider.stats()["by_api"]
    assert {api: row["ok"] for api, row in by_api.items()} == dict.fromkeys(
        ["anthropic", "azure", "gemini", "openai", "openai-responses"], 1
    )


# -- Anthropic Messages ---------------------------------------------------------------------------


def test_anthropic_answers_text_and_usage_with_its_rate_limit_headers(provider):
    """Messages: a text block, end_turn, usage with cache fields 0, anthropic-ratelimit-* headers."""
    provider.reset(anthropic_rpm=50, anthropic_itpm=10_000, anthropic_otpm=2_000)
    with _anthropic(provider) as client:
        raw = client.messages.with_raw_response.create(
            model="claude-demo",
            max_tokens=500,
            system="You label companies.",
            messages=[{"role": "user", "content": PROMPT}],
        )
    message = raw.parse()
    assert message.content[0].type == "text" and message.stop_reason == "end_turn"
    usage = message.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens == 0
    headers = raw.headers
    assert headers["anthropic-ratelimit-requests-limit"] == "50"
    assert headers["anthropic-ratelimit-requests-remaining"] == "49"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == str(10_000 - usage.input_tokens)
    # The 500 reserved on arrival were settled to what the answer used.
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == str(2_000 - usage.output_tokens)
    assert headers["anthropic-ratelimit-tokens-remaining"] == str(2_000 - usage.output_tokens)
    reset = datetime.fromisoformat(headers["anthropic-ratelimit-output-tokens-reset"].replace("Z", "+00:00"))
    assert 0 < (reset - datetime.now(UTC)).total_seconds() <= 2  # a few tokens refill in a second or so


def test_anthropic_forced_tool_fills_its_input_schema(provider):
    """A forced tool_choice is answered by a tool_use block whose input matches the input_schema."""
    with _anthropic(provider) as client:
        message = client.messages.create(
            model="claude-demo",
            max_tokens=300,
            messages=[{"role": "user", "content": PROMPT}],
            tools=[
                {"name": "record", "description": "Record it", "input_schema": Company.model_json_schema()}
            ],
            tool_choice={"type": "tool", "name": "record"},
        )
    assert message.stop_reason == "tool_use"
    block = message.content[0]
    assert block.type == "tool_use" and block.name == "record"
    assert Company.model_validate(block.input) == Company(name="Acme Robotics", industry="Robotics")


def test_anthropic_refuses_without_its_headers_and_max_tokens(provider):
    """No key is a 401 authentication_error, no max_tokens or anthropic-version a 400."""
    with _anthropic(provider) as client, pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        # The SDK would refuse to send it; its raw post sends what a client without it would.
        client.post(
            "/v1/messages",
            body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            cast_to=object,
        )
    with (
        anthropic.Anthropic(
            api_key="wrong-key", base_url=provider.url, max_retries=0, http_client=_http(provider)
        ) as client,
        pytest.raises(anthropic.AuthenticationError) as caught,
    ):
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    }
    response = _http(provider).post(
        "/v1/messages",
        headers={"x-api-key": demo.DEMO_KEY},
        json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 400 and "anthropic-version" in response.json()["error"]["message"]
    assert _http(provider).get("/v1/messages", headers={"x-api-key": demo.DEMO_KEY}).status_code == 405


def test_anthropic_charges_max_tokens_on_arrival_and_refuses_with_a_whole_second_retry_after(provider):
    """Two requests in flight reserving 600 output tokens each under 1000 OTPM: the second is a 429."""
    provider.reset(anthropic_otpm=1000, latency=0.3)

    async def both():
        async with _async_http(provider) as http:
            client = anthropic.AsyncAnthropic(
                api_key=demo.DEMO_KEY, base_url=provider.url, max_retries=0, http_client=http
            )
            ask = {"model": "m", "max_tokens": 600, "messages": [{"role": "user", "content": PROMPT}]}
            first = asyncio.create_task(client.messages.create(**ask))
            await asyncio.sleep(0.1)  # the first is in flight, holding its 600
            with pytest.raises(anthropic.RateLimitError) as caught:
                await client.messages.create(**ask)
            return await first, caught.value

    message, refusal = asyncio.run(both())
    assert refusal.body["error"]["type"] == "rate_limit_error"
    assert "1000 output tokens per minute" in refusal.body["error"]["message"]
    # 200 tokens more are needed at 1000/60 per second: 12 s, in whole seconds.
    assert refusal.response.headers["retry-after"] == "12"
    assert refusal.response.headers["anthropic-ratelimit-output-tokens-remaining"] == "400"
    assert message.usage.output_tokens < 600
    # Settled: the first gave back what it did not use.
    stats = provider.stats()["by_api"]["anthropic"]
    assert (stats["ok"], stats["rate_limited"], stats["output_tokens"]) == (1, 1, message.usage.output_tokens)


def test_anthropic_limits_input_tokens_apart_from_output_tokens(provider):
    """A tight ITPM refuses naming input tokens while the output budget has room; it refills per second."""
    provider.reset(anthropic_itpm=15, anthropic_otpm=100_000)
    with _anthropic(provider) as client:
        ask = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": PROMPT}]}
        first = client.messages.with_raw_response.create(**ask)
        spent = first.parse().usage.input_tokens
        with pytest.raises(anthropic.RateLimitError, match="15 input tokens per minute") as caught:
            client.messages.create(**ask)
        wait = int(caught.value.response.headers["retry-after"])
        assert wait == -(-(spent - (15 - spent)) * 60 // 15)  # the shortfall at 15 tokens a minute
        CLOCK.now += wait
        assert client.messages.create(**ask).content[0].text == "Robotics"
    assert first.headers["anthropic-ratelimit-output-tokens-remaining"] == str(
        100_000 - first.parse().usage.output_tokens
    )


def test_anthropic_overload_bursts_are_529_without_retry_after(provider):
    """Overloaded 5 s of every 20 s: a 529 overloaded_error, no retry-after; served after the burst."""
    provider.reset(overload_seconds=5.0, overload_period=20.0)
    with _anthropic(provider) as client:
        ask = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": PROMPT}]}
        with pytest.raises(anthropic.InternalServerError) as caught:
            client.messages.create(**ask)
        assert caught.value.status_code == 529
        assert caught.value.body["error"]["type"] == "overloaded_error"
        assert "retry-after" not in caught.value.response.headers
        CLOCK.now += 5.0
        assert client.messages.create(**ask).content[0].text == "Robotics"
    assert provider.stats()["by_api"]["anthropic"]["overloaded"] == 1


def test_an_overload_keeps_to_the_dialects_it_names(provider):
    """overload_apis=("anthropic",): chat completions answer while Anthropic is overloaded."""
    provider.reset(overload_rate=1.0, overload_apis=("anthropic",))
    with _anthropic(provider) as client, pytest.raises(anthropic.InternalServerError):
        client.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": PROMPT}])
    with _openai(provider) as client:
        ask = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
        assert client.chat.completions.create(**ask).choices[0].message.content == "Robotics"
        provider.configure(overload_apis=None)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(**ask)
    assert caught.value.status_code == 503


# -- Gemini generateContent -----------------------------------------------------------------------


def test_gemini_answers_text_structured_output_and_usage(provider):
    """generateContent: text, finishReason, usageMetadata; responseSchema and responseJsonSchema."""
    from google.genai import types

    client = _gemini(provider)
    plain = client.models.generate_content(
        model="gemini-demo",
        contents=PROMPT,
        config=types.GenerateContentConfig(system_instruction="Be brief.", temperature=0.0),
    )
    assert plain.text == "Robotics"
    assert plain.candidates[0].finish_reason == types.FinishReason.STOP
    usage = plain.usage_metadata
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count > 0
    for config in (
        types.GenerateContentConfig(response_mime_type="application/json", response_schema=Company),
        types.GenerateContentConfig(
            response_mime_type="application/json", response_json_schema=Company.model_json_schema()
        ),
    ):
        answer = client.models.generate_content(model="gemini-demo", contents=PROMPT, config=config)
        assert Company.model_validate_json(answer.text) == Company(name="Acme Robotics", industry="Robotics")


def test_gemini_per_minute_window_puts_its_wait_only_in_the_body(provider):
    """The 3rd request in a minute window of 2: 429 RESOURCE_EXHAUSTED, RetryInfo in the body, no header."""
    provider.reset(gemini_rpm=2)
    CLOCK.now = 6000.0 + 14.2  # 45.8 s left in the minute window
    client = _gemini(provider)
    for _ in range(2):
        client.models.generate_content(model="gemini-demo", contents=PROMPT)
    with pytest.raises(genai.errors.ClientError) as caught:
        client.models.generate_content(model="gemini-demo", contents=PROMPT)
    error = caught.value
    assert (error.code, error.status) == (429, "RESOURCE_EXHAUSTED")
    assert "retry-after" not in {k.lower() for k in error.response.headers}
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in error.details["error"]["details"]}
    assert details["RetryInfo"]["retryDelay"] == "45.8s"
    assert (
        details["QuotaFailure"]["violations"][0]["quotaId"] == "GenerateRequestsPerMinutePerProjectPerModel"
    )
    CLOCK.now = 6060.0  # the next window
    assert client.models.generate_content(model="gemini-demo", contents=PROMPT).text == "Robotics"


def test_gemini_per_minute_input_tokens_name_their_quota(provider):
    """Past gemini_tpm input tokens in the minute window: the QuotaFailure names the token quota."""
    provider.reset(gemini_tpm=15)
    client = _gemini(provider)
    client.models.generate_content(model="gemini-demo", contents=PROMPT)
    with pytest.raises(genai.errors.ClientError) as caught:
        client.models.generate_content(model="gemini-demo", contents=PROMPT)
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in caught.value.details["error"]["details"]}
    assert (
        details["QuotaFailure"]["violations"][0]["quotaId"] == "GenerateContentInputTokensPerModelPerMinute"
    )
    assert details["RetryInfo"]["retryDelay"] == "60s"


def test_gemini_per_day_quota_names_the_daily_quota(provider):
    """Past gemini_rpd, a 429 whose QuotaFailure names GenerateRequestsPerDayPerProjectPerModel."""
    provider.reset(gemini_rpd=1)
    client = _gemini(provider)
    client.models.generate_content(model="gemini-demo", contents=PROMPT)
    CLOCK.now += 120.0  # minutes later: still the same day
    with pytest.raises(genai.errors.ClientError) as caught:
        client.models.generate_content(model="gemini-demo", contents=PROMPT)
    body = caught.value.details["error"]
    assert body["status"] == "RESOURCE_EXHAUSTED"
    quota = next(d for d in body["details"] if d["@type"].endswith("QuotaFailure"))
    assert quota["violations"][0]["quotaId"] == "GenerateRequestsPerDayPerProjectPerModel"
    assert quota["violations"][0]["quotaValue"] == "1"
    assert provider.stats()["by_api"]["gemini"]["rate_limited"] == 1


def test_gemini_overload_and_wrong_key_answer_as_google_does(provider):
    """An overload is 503 UNAVAILABLE "The model is overloaded"; a wrong key 400 API_KEY_INVALID."""
    provider.reset(overload_rate=1.0)
    with pytest.raises(genai.errors.ServerError) as caught:
        _gemini(provider).models.generate_content(model="gemini-demo", contents=PROMPT)
    assert (caught.value.code, caught.value.status) == (503, "UNAVAILABLE")
    assert "overloaded" in caught.value.message
    from google.genai import types

    wrong = genai.Client(
        api_key="wrong-key",
        http_options=types.HttpOptions(base_url=provider.url, httpx_client=_http(provider)),
    )
    with pytest.raises(genai.errors.ClientError) as refused:
        wrong.models.generate_content(model="gemini-demo", contents=PROMPT)
    assert refused.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"


def test_gemini_takes_its_key_in_the_query_too(provider):
    """?key= is Gemini's other place for the key; the path under /v1beta answers as under /v1."""
    body = {"contents": [{"parts": [{"text": PROMPT}]}]}
    answer = _http(provider).post(
        f"/v1beta/models/gemini-demo:generateContent?key={demo.DEMO_KEY}", json=body
    )
    assert answer.status_code == 200
    assert answer.json()["candidates"][0]["content"]["parts"][0]["text"] == "Robotics"
    assert provider.stats()["key_places"] == {"query": 1}


def test_gemini_refuses_contents_without_a_user_turn_in_its_own_names(provider):
    """contents holding only a model turn is a 400 naming contents (Gemini's field), not chat's messages."""
    body = {"contents": [{"role": "model", "parts": [{"text": "first"}]}]}
    answer = _http(provider).post(
        "/v1beta/models/gemini-demo:generateContent", json=body, headers={"x-goog-api-key": demo.DEMO_KEY}
    )
    said = answer.json()["error"]["message"]
    assert answer.status_code == 400 and "contents" in said and "messages" not in said


def test_gemini_response_schema_is_read_as_json_schema():
    """Google's OpenAPI subset (upper-case types, nullable) becomes the JSON Schema it stands for."""
    given = {
        "type": "OBJECT",
        "properties": {
            "n": {"type": "INTEGER", "nullable": True},
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
        },
        "propertyOrdering": ["n", "tags"],
    }
    assert json_schema(given) == {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    assert [retry_delay(s) for s in (45.8, 2.0, 0.0004)] == ["45.8s", "2s", "0.001s"]


# -- OpenAI Responses -----------------------------------------------------------------------------


def test_responses_answers_text_structured_output_and_usage(provider):
    """Responses: output_text, a parsed json_schema answer, usage in input/output tokens."""
    with _openai(provider) as client:
        plain = client.responses.create(
            model="m", instructions="Be brief.", input=PROMPT, max_output_tokens=50
        )
        assert plain.output_text == "Robotics" and plain.status == "completed"
        assert plain.usage.total_tokens == plain.usage.input_tokens + plain.usage.output_tokens
        assert plain.usage.input_tokens_details.cached_tokens == 0
        parsed = client.responses.parse(
            model="m", input=[{"role": "user", "content": PROMPT}], text_format=Company
        )
        assert parsed.output_parsed == Company(name="Acme Robotics", industry="Robotics")
        cut = client.responses.create(
            model="m", input="Summarise: " + "many words here " * 30, max_output_tokens=16
        )
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_responses_share_openais_per_minute_limits(provider):
    """A Responses request past chat_rpm is OpenAI's 429 with its headers."""
    provider.reset(chat_rpm=60)  # a bucket of one request a second
    with _openai(provider) as client:
        client.responses.create(model="m", input=PROMPT)
        with pytest.raises(openai.RateLimitError) as caught:
            client.responses.create(model="m", input=PROMPT)
    assert caught.value.response.headers["x-ratelimit-limit-requests"] == "60"
    assert caught.value.response.headers["retry-after-ms"] == "1000"


# -- Azure OpenAI ---------------------------------------------------------------------------------


def test_azure_refuses_in_10_second_windows_below_the_per_minute_quota(provider):
    """azure_rpm=60: the 11th request in a 10 s window is a 429 with retry-after and retry-after-ms."""
    provider.reset(azure_rpm=60)
    CLOCK.now = 6004.0  # 6 s left in the window

    async def run():
        async with _async_http(provider) as http:
            client = openai.AsyncAzureOpenAI(
                api_key=demo.DEMO_KEY,
                api_version="2024-10-21",
                azure_endpoint=provider.url,
                max_retries=0,
                http_client=http,
            )
            ask = {"model": "my-deployment", "messages": [{"role": "user", "content": PROMPT}]}
            answers = [await client.chat.completions.with_raw_response.create(**ask) for _ in range(10)]
            with pytest.raises(openai.RateLimitError) as caught:
                await client.chat.completions.create(**ask)
            CLOCK.now = 6010.0
            again = await client.chat.completions.create(**ask)
            return answers, caught.value, again

    answers, refusal, again = asyncio.run(run())
    assert answers[0].headers["x-ratelimit-remaining-requests"] == "9"
    assert not any(
        h.startswith("x-ratelimit-limit") for h in answers[0].headers
    )  # Azure sends remaining only
    assert answers[-1].parse().model == "my-deployment"
    headers = refusal.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("6", "6000")
    assert refusal.body["code"] == "429" and "call rate limit" in refusal.body["message"]
    assert again.choices[0].message.content == "Robotics"


def test_azure_charges_prompt_plus_max_tokens_on_arrival(provider):
    """azure_tpm=600 (100 per window): two requests of max_tokens=60 cannot share a window."""
    provider.reset(azure_tpm=600)
    client = openai.AzureOpenAI(
        api_key=demo.DEMO_KEY,
        api_version="2024-10-21",
        azure_endpoint=provider.url,
        max_retries=0,
        http_client=_http(provider),
    )
    ask = {"model": "d", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 60}
    first = client.chat.completions.with_raw_response.create(**ask)
    used = first.parse().usage
    assert used.total_tokens < 50  # what was used leaves room for another...
    assert first.headers["x-ratelimit-remaining-tokens"] == str(100 - used.prompt_tokens - 60)
    with pytest.raises(openai.RateLimitError, match="token rate limit"):
        client.chat.completions.create(**ask)  # ...but what was charged does not


def test_azure_needs_its_key_and_api_version(provider):
    """No api-key is a 401, no api-version a 404, as Azure answers."""
    http = _http(provider)
    path = "/openai/deployments/d/chat/completions"
    body = {"messages": [{"role": "user", "content": "hi"}]}
    refused = http.post(path, params={"api-version": "2024-10-21"}, json=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "401"
    missing = http.post(path, headers={"api-key": demo.DEMO_KEY}, json=body)
    assert missing.status_code == 404


# -- Bedrock Converse -----------------------------------------------------------------------------


@pytest.fixture
def bedrock(demo_loopback):
    botocore_session = pytest.importorskip("botocore.session")
    from botocore.config import Config

    session = botocore_session.get_session()
    client = session.create_client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=demo_loopback.url,
        aws_access_key_id=demo.DEMO_KEY,
        aws_secret_access_key="demo-secret",
        config=Config(retries={"total_max_attempts": 1}),
    )
    return demo_loopback, client


def test_bedrock_converse_answers_text_a_forced_tool_and_usage(bedrock):
    """Converse, SigV4-signed by botocore: text, a forced toolUse filling the inputSchema, usage."""
    _, client = bedrock
    model = "anthropic.claude-3-haiku-20240307-v1:0"
    plain = client.converse(
        modelId=model,
        system=[{"text": "Be brief."}],
        messages=[{"role": "user", "content": [{"text": PROMPT}]}],
        inferenceConfig={"maxTokens": 100, "temperature": 0.0},
    )
    assert plain["output"]["message"]["content"][0]["text"] == "Robotics"
    assert plain["stopReason"] == "end_turn"
    usage = plain["usage"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0
    tool = {"toolSpec": {"name": "record", "inputSchema": {"json": Company.model_json_schema()}}}
    forced = client.converse(
        modelId=model,
        messages=[{"role": "user", "content": [{"text": PROMPT}]}],
        toolConfig={"tools": [tool], "toolChoice": {"tool": {"name": "record"}}},
    )
    assert forced["stopReason"] == "tool_use"
    use = forced["output"]["message"]["content"][0]["toolUse"]
    assert Company.model_validate(use["input"]) == Company(name="Acme Robotics", industry="Robotics")


def test_bedrock_throttles_as_bedrock_does(bedrock):
    """Past bedrock_rpm: ThrottlingException, HTTP 429, saying nothing of which quota."""
    server, client = bedrock
    server.reset(bedrock_rpm=1)
    botocore_exceptions = pytest.importorskip("botocore.exceptions")
    ask = {"modelId": "m", "messages": [{"role": "user", "content": [{"text": PROMPT}]}]}
    client.converse(**ask)
    with pytest.raises(botocore_exceptions.ClientError) as caught:
        client.converse(**ask)
    response = caught.value.response
    assert response["Error"]["Code"] == "ThrottlingException"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["Error"]["Message"] == "Too many requests, please wait before trying again."


def test_bedrock_refuses_a_request_not_signed_in_sigv4s_shape(demo_loopback):
    """A bearer key is not a SigV4 signature: 403 UnrecognizedClientException."""
    import httpx

    refused = httpx.post(
        demo_loopback.url + "/model/m/converse",
        headers={"Authorization": f"Bearer {demo.DEMO_KEY}"},
        json={"messages": [{"role": "user", "content": [{"text": "hi"}]}]},
    )
    assert refused.status_code == 403
    assert refused.headers["x-amzn-ErrorType"].startswith("UnrecognizedClientException")


# -- a local server -------------------------------------------------------------------------------


def test_a_local_server_answers_503_past_its_slots_and_queue(provider):
    """2 slots and a queue of 1: of 6 requests at once 3 are answered, 3 refused 503 at once, no key."""
    provider.reset(local_slots=2, local_queue=1, local_service_seconds=0.3)

    async def run():
        async with _async_http(provider) as http:
            client = openai.AsyncOpenAI(
                api_key="none", base_url=provider.url + "/v1", max_retries=0, http_client=http
            )
            ask = {"model": "llama", "messages": [{"role": "user", "content": PROMPT}]}
            return await asyncio.gather(
                *(client.chat.completions.with_raw_response.create(**ask) for _ in range(6)),
                return_exceptions=True,
            )

    outcomes = asyncio.run(run())
    refused = [o for o in outcomes if isinstance(o, openai.InternalServerError)]
    answered = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(answered) == 3 and len(refused) == 3
    assert all(r.status_code == 503 for r in refused)
    assert not any(h.startswith("x-ratelimit") for a in answered for h in a.headers)
    stats = provider.stats()
    assert stats["by_api"]["local"]["by_status"] == {"200": 3, "503": 3}
    assert stats["in_flight"] == 0


def test_a_local_server_gives_a_cancelled_waiters_place_to_the_next(provider):
    """A queued request that gives up frees its place: the next one waits and is answered, not refused."""
    provider.reset(local_slots=1, local_queue=1, local_service_seconds=0.3)

    async def run():
        async with _async_http(provider) as http:
            body = {"model": "llama", "messages": [{"role": "user", "content": PROMPT}]}
            first = asyncio.create_task(http.post("/v1/chat/completions", json=body))
            await asyncio.sleep(0.05)
            gives_up = asyncio.create_task(http.post("/v1/chat/completions", json=body))
            await asyncio.sleep(0.05)
            gives_up.cancel()
            await asyncio.sleep(0.05)
            then = await http.post("/v1/chat/completions", json=body)
            return (await first).status_code, then.status_code

    assert asyncio.run(run()) == (200, 200)
    assert provider.stats()["in_flight"] == 0


# -- settings -------------------------------------------------------------------------------------


def test_the_dialect_settings_are_validated_with_their_names():
    """A bad dialect setting is refused naming it."""
    with pytest.raises(ValueError, match="anthropic_otpm"):
        demo.DemoSettings(anthropic_otpm=0)
    with pytest.raises(ValueError, match="overload_seconds"):
        demo.DemoSettings(overload_seconds=30.0, overload_period=10.0)
    with pytest.raises(ValueError, match="overload_apis"):
        demo.DemoSettings(overload_apis=("anthropc",))
    with pytest.raises(ValueError, match="local_queue"):
        demo.DemoSettings(local_queue=-1)
    assert json.dumps(demo.DemoSettings(overload_apis=("gemini",)).public())


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"overload_period": 10.0}, "overload_period=10 does nothing with overload_seconds=0"),
        ({"overload_seconds": 5.0}, "overload_seconds=5 needs overload_period"),
        ({"overload_seconds": 5.0, "overload_rate": 0.1}, "overload_seconds=5 needs overload_period"),
        ({"local_queue": 3}, "local_queue=3 does nothing without local_slots"),
        ({"local_service_seconds": 0.5}, "local_service_seconds=0.5 does nothing without local_slots"),
    ],
)
def test_a_setting_that_would_do_nothing_is_refused(given, said):
    """A demo setting that does nothing without another (an overload period without its seconds, a queue without slots) is refused naming both."""
    with pytest.raises(ValueError) as refused:
        demo.DemoSettings(**given)
    assert said in str(refused.value)
    demo.DemoSettings(overload_seconds=5.0, overload_period=10.0, local_slots=1, local_queue=3)


def test_a_misspelt_setting_is_told_the_one_meant(provider):
    """A misspelt setting names the one it is nearest, letters swapped round included."""
    with pytest.raises(
        TypeError, match="unknown demo setting 'gemini_rdp' \\(did you mean 'gemini_rpd'\\?\\)"
    ):
        provider.configure(gemini_rdp=5)
    with pytest.raises(TypeError, match="did you mean 'overload_period'"):
        provider.configure(overload_perod=5)


def test_the_command_line_refuses_a_setting_that_would_do_nothing_naming_its_flags():
    """`python -m playbook.demo --overload-seconds 5` without a period exits 2 naming --overload-period."""
    out = subprocess.run(
        [sys.executable, "-m", "playbook.demo", "--port", "0", "--overload-seconds", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--overload-seconds=5 needs --overload-period" in out.stderr
