"""The demo's OpenAI-compatible surface, driven by the real ``openai`` SDK: chat completions with
usage and ``max_tokens``, structured outputs, per-minute token and request limits with OpenAI's
headers, usage counters, and the files and batches API; plus unit tests of the pieces (the
duration format, the per-minute buckets, the schema checker and filler).

The provider is served in process (``serve(in_process=True)``; the SDK sends through Starlette's
``TestClient``, no socket) on a frozen clock that only the tests move, so rate limits and batch
progress are exact and nothing waits in real time.  A restart needs a port to close: that test
alone serves it on loopback.
"""

from __future__ import annotations

import enum
import json
import math
import re
import time
from datetime import date, datetime
from typing import Literal
from uuid import UUID

import httpx
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError
from starlette.testclient import TestClient
from vtime import FrozenClock

from playbook import demo
from playbook.demo.limits import MinuteBuckets, format_duration
from playbook.demo.schema_check import SchemaError, check_strict
from playbook.demo.schema_fill import fill

openai = pytest.importorskip("openai")

AUTH = {"Authorization": f"Bearer {demo.DEMO_KEY}"}
MODEL = "demo-mini"


CLOCK = FrozenClock(5000.0)


@pytest.fixture(scope="module")
def server():
    with demo.serve(clock=CLOCK, in_process=True) as running:
        yield running


@pytest.fixture
def provider(server):
    server.reset()
    return server


def _http(provider):
    """An HTTP client of the provider served in process (no socket)."""
    return TestClient(provider.app, base_url=provider.url)


@pytest.fixture
def client(provider):
    with openai.OpenAI(
        base_url=provider.url + "/v1", api_key=demo.DEMO_KEY, max_retries=0, http_client=_http(provider)
    ) as sdk:
        yield sdk


def _ask(client, content, model=MODEL, **options):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], **options
    )


# -- models for structured outputs --------------------------------------------------------------


class Size(enum.StrEnum):
    small = "small"
    large = "large"


class Address(BaseModel):
    city: str
    country: Literal["US", "GB", "DE"]


class Company(BaseModel):
    name: str
    industry: Literal["Robotics", "Energy", "Retail", "Software"]
    size: Size
    employees: int = Field(ge=1, le=500)
    confidence: float
    public: bool
    tags: list[str]
    headquarters: Address
    parent: Address | None
    summary: str


class Node(BaseModel):
    label: str
    children: list[Node]


class Formats(BaseModel):
    founded: date
    updated: datetime
    ident: UUID
    website: str
    ratio: float = Field(gt=0, lt=1)
    stars: int = Field(ge=0, le=50, multiple_of=5)
    codes: list[Literal["a", "b", "c"]] = Field(min_length=2, max_length=2)
    note: str | None = None
    short: str = Field(min_length=3, max_length=5)


# -- chat completions ---------------------------------------------------------------------------


def test_create_parses_with_usage_and_keeps_the_plain_answers(client):
    """chat.completions.create parses: the classify/summarise text answer, finish "stop", usage by ~4 chars a token."""
    reply = _ask(client, "Classify the industry of Acme Robotics.")
    assert reply.choices[0].message.content == "Robotics" and reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == math.ceil(len("Classify the industry of Acme Robotics.") / 4) + 4
    assert reply.usage.completion_tokens == 2 and reply.usage.total_tokens == reply.usage.prompt_tokens + 2
    summary = _ask(client, "Summarise: Acme Robotics builds warehouse robots for retailers.")
    assert summary.choices[0].message.content.startswith("Summary: Acme Robotics builds")
    assert _ask(client, "Classify the industry of Acme Robotics.").id == reply.id


def test_max_tokens_cuts_the_answer_with_finish_reason_length(client):
    """max_tokens and max_completion_tokens cut the content to that many tokens, finish_reason "length"."""
    prompt = "Summarise: Acme Robotics builds warehouse robots for retailers across Europe and beyond."
    full = _ask(client, prompt).choices[0].message.content
    for option in ("max_tokens", "max_completion_tokens"):
        cut = _ask(client, prompt, **{option: 3})
        assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3
        assert cut.choices[0].message.content == full[:12]
    assert _ask(client, prompt, max_tokens=500).choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        _ask(client, prompt, max_tokens=0)


def test_parse_fills_a_pydantic_model_from_the_prompt(client):
    """chat.completions.parse yields a valid model (Literal, enum, nested, list, Optional), the same on every call."""
    messages = [{"role": "user", "content": "Classify the industry of Acme Robotics."}]
    first = client.chat.completions.parse(model=MODEL, messages=messages, response_format=Company)
    again = client.chat.completions.parse(model=MODEL, messages=messages, response_format=Company)
    company = first.choices[0].message.parsed
    assert isinstance(company, Company) and again.choices[0].message.parsed == company
    assert company.name == "Acme Robotics" and company.industry == "Robotics"
    assert (
        company.summary.startswith("Summary:")
        and 1 <= len(company.tags) <= 3
        and 1 <= company.employees <= 500
    )
    assert first.usage.completion_tokens == math.ceil(len(first.choices[0].message.content) / 4)
    tree = (
        client.chat.completions.parse(model=MODEL, messages=messages, response_format=Node)
        .choices[0]
        .message.parsed
    )
    assert isinstance(tree, Node)
    other = [{"role": "user", "content": "Classify into Retail or Energy: Sunny Solar Ltd"}]
    assert (
        client.chat.completions.parse(model=MODEL, messages=other, response_format=Company)
        .choices[0]
        .message.parsed.industry
        == "Energy"
    )


def test_a_structured_answer_cut_by_max_tokens_raises_length_error(client):
    """A structured answer cut short by max_tokens makes the SDK's parse raise LengthFinishReasonError."""
    messages = [{"role": "user", "content": "Describe Acme Robotics."}]
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=MODEL, messages=messages, response_format=Company, max_tokens=5)


def _strict(schema, name="Answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def test_an_invalid_strict_schema_is_a_bad_request_naming_the_path(client):
    """A strict schema breaking OpenAI's rules is a 400 (BadRequestError) in OpenAI's shape naming where."""
    nested_open = {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}
    cases = {
        "('properties', 'a'), 'additionalProperties'": {
            "type": "object",
            "properties": {"a": nested_open},
            "required": ["a"],
            "additionalProperties": False,
        },
        "context=(), 'required' is required": {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
            "required": ["a"],
            "additionalProperties": False,
        },
        "'type: \"array\"'": {"type": "array", "items": {"type": "string"}},
    }
    for expected, schema in cases.items():
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(client, "Describe Acme Robotics.", response_format=_strict(schema))
        error = caught.value.body
        assert expected in error["message"] and "'Answer'" in error["message"], error
        assert error["type"] == "invalid_request_error" and error["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="Supported values"):
        _ask(client, "Describe Acme Robotics.", response_format={"type": "xml"})


def test_json_object_answers_an_object_and_needs_the_word_json(client):
    """response_format json_object answers a JSON object; without "json" in the messages it is a 400."""
    reply = _ask(
        client,
        "Classify the industry of Acme Robotics. Answer in JSON.",
        response_format={"type": "json_object"},
    )
    assert json.loads(reply.choices[0].message.content) == {"answer": "Robotics"}
    with pytest.raises(openai.BadRequestError, match="json"):
        _ask(client, "Classify the industry of Acme Robotics.", response_format={"type": "json_object"})


def _structured(client, messages):
    reply = client.chat.completions.create(model=MODEL, messages=messages, response_format=_strict(SIMPLE))
    try:
        json.loads(reply.choices[0].message.content)
    except ValueError:
        return False
    return True


SIMPLE = {
    "type": "object",
    "properties": {"industry": {"type": "string"}},
    "required": ["industry"],
    "additionalProperties": False,
}


def test_invalid_json_rate_breaks_a_deterministic_share_of_json_answers(provider, client):
    """chat_invalid_json_rate breaks that share of JSON answers, the same ones on every call; a re-ask draws anew."""
    provider.configure(chat_invalid_json_rate=0.5)
    conversations = [[{"role": "user", "content": f"Classify Company {i}."}] for i in range(40)]
    verdicts = [_structured(client, c) for c in conversations]
    assert 10 <= verdicts.count(False) <= 30
    assert [_structured(client, c) for c in conversations] == verdicts
    reask = {"role": "user", "content": "That was not valid JSON. Answer again."}
    broken = [c for c, ok in zip(conversations, verdicts) if not ok]
    retried = [_structured(client, [*c, {"role": "assistant", "content": "{"}, reask]) for c in broken]
    assert any(retried) and not all(retried)
    provider.configure(chat_invalid_json_rate=1.0)
    assert not any(_structured(client, c) for c in conversations[:5])
    assert _ask(client, "Classify Company 1.").choices[0].message.content  # plain text is never broken
    with pytest.raises(ValidationError):
        client.chat.completions.parse(model=MODEL, messages=conversations[0], response_format=Company)


# -- per-minute limits --------------------------------------------------------------------------

DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$|^(\d+)ms$")


def parse_duration(text: str) -> float:
    """Seconds in an OpenAI header duration ("6m0s", "1.5s", "20ms"), independently of the server's code."""
    match = DURATION.match(text)
    assert match and text, text
    hours, minutes, seconds, millis = match.groups()
    if millis is not None:
        return int(millis) / 1000
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def test_a_token_burst_is_refused_with_openai_headers_and_the_wait_is_exact(provider, client):
    """chat_tpm: a burst gets RateLimitError with retry-after-ms and x-ratelimit-*; 1 ms early is refused, on time admitted."""
    provider.configure(chat_tpm=6000, chat_rpm=600)  # buckets of 100 tokens and 10 requests
    prompt = "Summarise: Acme Robotics builds robots."
    answered = []
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(10):
            answered.append(
                client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": prompt}]
                )
            )
    weight = answered[0].parse().usage.total_tokens
    assert len(answered) == 100 // weight >= 2
    headers = caught.value.response.headers
    body = caught.value.body
    assert body["type"] == "tokens" and body["code"] == "rate_limit_exceeded" and body["param"] is None
    assert (
        body["message"].startswith(f"Rate limit reached for {MODEL}")
        and "tokens per min (TPM): Limit 6000" in body["message"]
    )
    assert headers["x-ratelimit-limit-tokens"] == "6000" and headers["x-ratelimit-limit-requests"] == "600"
    assert int(headers["x-ratelimit-remaining-tokens"]) < 100 and headers[
        "x-ratelimit-remaining-requests"
    ] == str(10 - len(answered))
    for name in ("x-ratelimit-reset-tokens", "x-ratelimit-reset-requests"):
        assert parse_duration(headers[name]) > 0
    wait_ms = int(headers["retry-after-ms"])
    assert (
        headers["retry-after"] == str(math.ceil(wait_ms / 1000))
        and f"try again in {format_duration(wait_ms / 1000)}" in body["message"]
    )
    last = answered[-1]
    assert last.headers["x-ratelimit-remaining-tokens"] == headers["x-ratelimit-remaining-tokens"]
    started = CLOCK.now
    CLOCK.now = started + (wait_ms - 1) / 1000
    with pytest.raises(openai.RateLimitError):
        _ask(client, prompt)
    CLOCK.now = started + wait_ms / 1000
    assert _ask(client, prompt).choices[0].finish_reason == "stop"


def test_a_request_limit_refuses_on_requests_and_only_configured_limits_send_headers(provider, client):
    """chat_rpm alone: the second request at once is a "requests" 429; no token headers; none at all without limits."""
    plain = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}]
    )
    assert not [h for h in plain.headers if h.startswith("x-ratelimit")]
    provider.configure(chat_rpm=60, chat_bucket_seconds=1.0)
    first = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}]
    )
    assert (
        first.headers["x-ratelimit-remaining-requests"] == "0"
        and "x-ratelimit-limit-tokens" not in first.headers
    )
    assert parse_duration(first.headers["x-ratelimit-reset-requests"]) == 1.0
    with pytest.raises(openai.RateLimitError) as caught:
        _ask(client, "Hello there")
    assert (
        caught.value.body["type"] == "requests"
        and "requests per min (RPM): Limit 60" in caught.value.body["message"]
    )
    assert caught.value.response.headers["retry-after-ms"] == "1000"
    CLOCK.now += 1.0
    assert _ask(client, "Hello there").choices[0].message.content


def test_a_request_heavier_than_the_bucket_fits_once_it_has_refilled_to_its_weight(provider, client):
    """A request weighing more than the bucket holds is admitted once the bucket refills to its weight."""
    provider.configure(chat_tpm=60)  # one token a second, a bucket of one token
    prompt = "Summarise: Acme Robotics builds warehouse robots for retailers."
    assert _ask(client, prompt).usage.total_tokens > 1
    with pytest.raises(openai.RateLimitError) as caught:
        _ask(client, prompt)
    CLOCK.now += int(caught.value.response.headers["retry-after-ms"]) / 1000
    assert _ask(client, prompt).choices[0].message.content


def test_usage_counters_match_the_answers_and_reset_clears_them(provider, client):
    """/_stats counts answered chat usage per model exactly as the answers report it; 429s by kind, not as usage."""
    provider.configure(chat_rpm=120)  # a bucket of two requests
    replies = [
        _ask(client, "Classify the industry of Acme Robotics.", model=m) for m in ("demo-mini", "demo-large")
    ]
    with pytest.raises(openai.RateLimitError):
        _ask(client, "Classify the industry of Acme Robotics.")
    CLOCK.now += 1.0
    replies.append(_ask(client, "Summarise: a long page about robots.", model="demo-mini"))
    expected: dict[str, dict[str, int]] = {}
    for reply in replies:
        row = expected.setdefault(reply.model, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})
        row["requests"] += 1
        row["prompt_tokens"] += reply.usage.prompt_tokens
        row["completion_tokens"] += reply.usage.completion_tokens
    with _http(provider) as http:
        stats = http.get("/_stats").json()
        assert stats["chat"] == expected and stats["chat_rate_limited"] == {"requests": 1, "tokens": 0}
        assert stats["rate_limited"] == 1 and stats["by_status"] == {"200": 3, "429": 1}
        http.post("/_reset")
        stats = http.get("/_stats").json()
    assert (
        stats["chat"] == {}
        and stats["chat_rate_limited"] == {"requests": 0, "tokens": 0}
        and stats["batches_created"] == 0
    )


# -- files and batches --------------------------------------------------------------------------


def _line(custom_id, content, url="/v1/chat/completions", **body):
    request = {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": request})


def _upload(client, lines):
    return client.files.create(file=("requests.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch")


def _batch(client, lines, **options):
    upload = _upload(client, lines)
    return client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h", **options
    )


def _jsonl(client, file_id):
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_validating_in_progress_completed_and_answers_like_direct_calls(provider, client):
    """files.create + batches.create: the batch completes after batch_seconds; its output file holds the direct answers, in order."""
    provider.configure(batch_seconds=10.0)
    prompts = [f"Classify the industry of Company {i}." for i in range(5)]
    upload = _upload(client, [_line(f"row-{i}", p) for i, p in enumerate(prompts)])
    assert upload.purpose == "batch" and upload.bytes > 0 and upload.id.startswith("file-")
    assert client.files.retrieve(upload.id).filename == "requests.jsonl"
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "t1"},
    )
    assert batch.status == "validating" and batch.id.startswith("batch_") and batch.metadata == {"run": "t1"}
    CLOCK.now += 5.5
    running = client.batches.retrieve(batch.id)
    assert (
        running.status == "in_progress"
        and running.request_counts.total == 5
        and 0 < running.request_counts.completed < 5
    )
    assert running.output_file_id is None
    CLOCK.now += 5.0
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts.completed == 5 and done.error_file_id is None
    lines = _jsonl(client, done.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"row-{i}" for i in range(5)]
    for line, prompt in zip(lines, prompts):
        direct = _ask(client, prompt)
        body = line["response"]["body"]
        assert (
            line["id"].startswith("batch_req_")
            and line["response"]["status_code"] == 200
            and line["error"] is None
        )
        assert (
            body["id"] == direct.id
            and body["choices"][0]["message"]["content"] == direct.choices[0].message.content
        )
        assert body["usage"]["total_tokens"] == direct.usage.total_tokens
    stats = provider.stats()
    assert stats["batches_created"] == 1 and stats["chat_batch"][MODEL]["requests"] == 5
    assert stats["chat"][MODEL]["requests"] == 10  # five in the batch, five direct
    assert done.usage.input_tokens == stats["chat_batch"][MODEL]["prompt_tokens"]


def test_invalid_lines_go_to_the_error_file_with_a_400(provider, client):
    """Lines that are not JSON, call another URL or carry a bad body land in the error file with a 400 body."""
    provider.configure(batch_seconds=1.0)
    lines = [
        _line("good", "Classify: Acme Robotics"),
        "{not json",
        _line("elsewhere", "hi", url="/v1/embeddings"),
        _line("bad", "hi", n=3),
    ]
    batch = _batch(client, lines)
    CLOCK.now += 1.0
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (
        1,
        3,
    )
    assert [line["custom_id"] for line in _jsonl(client, done.output_file_id)] == ["good"]
    errors = _jsonl(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == [None, "elsewhere", "bad"]
    assert {e["response"]["status_code"] for e in errors} == {400}
    assert [e["response"]["body"]["error"]["param"] for e in errors] == [None, "url", "n"]


def test_a_malformed_input_file_fails_the_whole_batch(provider, client):
    """A file that is no batch (a custom_id twice, or empty) fails the batch with errors after validating."""
    provider.configure(batch_seconds=1.0)
    twice = _batch(client, [_line("same", "a"), _line("same", "b")])
    empty = client.batches.create(
        input_file_id=_upload(client, [""]).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    CLOCK.now += 0.1
    for batch, code in ((twice, "duplicate_custom_id"), (empty, "empty_file")):
        failed = client.batches.retrieve(batch.id)
        assert (
            failed.status == "failed" and failed.errors.data[0].code == code and failed.output_file_id is None
        )
    assert client.batches.retrieve(twice.id).errors.data[0].line == 2


@pytest.mark.network
def test_a_batch_survives_a_restart_but_not_a_reset():
    """Files and batches outlive /_restart (the provider keeps its jobs) and are gone after /_reset
    (on loopback: a restart closes the server's port)."""
    with (
        demo.serve(port=0, clock=CLOCK, batch_seconds=1.0) as provider,
        openai.OpenAI(base_url=provider.url + "/v1", api_key=demo.DEMO_KEY, max_retries=0) as client,
    ):
        batch = _batch(client, [_line("one", "Classify: Acme Robotics")])
        with httpx.Client(base_url=provider.url, timeout=10) as http:
            assert http.post("/_restart", json={"down": 0.3}).status_code == 200
            _until(lambda: not _listening(http))  # the port closes once the answer is out
            _until(lambda: _listening(http))
        CLOCK.now += 1.0
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed" and len(_jsonl(client, done.output_file_id)) == 1
        provider.reset()
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(done.output_file_id)


def _listening(http):
    try:
        return http.get("/_health").status_code == 200
    except httpx.TransportError:
        return False


def _until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_cancel_keeps_what_was_done_and_list_pages_newest_first(provider, client):
    """batches.cancel: cancelling, then cancelled with the answers done so far; batches.list pages newest first."""
    provider.configure(batch_seconds=10.0)
    batch = _batch(client, [_line(f"r{i}", f"Classify: Company {i}") for i in range(10)])
    CLOCK.now += 5.5  # half of the answering time
    assert client.batches.cancel(batch.id).status == "cancelling"
    CLOCK.now += 1.0
    cancelled = client.batches.retrieve(batch.id)
    assert cancelled.status == "cancelled" and cancelled.request_counts.completed == 5
    assert [line["custom_id"] for line in _jsonl(client, cancelled.output_file_id)] == [
        f"r{i}" for i in range(5)
    ]
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(_finished(client).id)
    ids = [_batch(client, [_line("x", "hi")]).id for _ in range(3)]
    listed = [b.id for b in client.batches.list(limit=2)]  # the SDK follows has_more across pages
    assert listed[:3] == ids[::-1] and len(listed) == 5


def _finished(client):
    batch = _batch(client, [_line("x", "hi")])
    CLOCK.now += 10.0
    return client.batches.retrieve(batch.id)


def test_files_and_batches_need_a_key_and_answer_405_to_other_methods(provider):
    """The new /v1 routes go through auth like the others; a wrong method on them is a 405."""
    with _http(provider) as http:
        assert http.get("/v1/batches").status_code == 401
        assert http.get("/v1/batches", headers=AUTH).json()["object"] == "list"
        assert http.delete("/v1/batches/batch_1", headers=AUTH).status_code == 405
        assert http.put("/v1/files", headers=AUTH).status_code == 405
        assert http.get("/v1/files/nope/content", headers=AUTH).status_code == 404
        assert http.post("/v1/files", headers=AUTH, content=b"x").status_code == 400
    stats = provider.stats()
    assert stats["by_endpoint"]["GET /v1/batches"] == 2 and stats["by_auth"]["rejected"] == 1


# -- units: durations, buckets, schemas ---------------------------------------------------------


def test_the_new_settings_are_validated_with_their_names():
    """chat_rpm, chat_tpm, chat_bucket_seconds, chat_invalid_json_rate and batch_seconds refuse bad values by name."""
    for bad in (
        {"chat_rpm": 0},
        {"chat_tpm": 1.5},
        {"chat_bucket_seconds": 0},
        {"chat_invalid_json_rate": 2},
        {"batch_seconds": -1},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            demo.DemoSettings(**bad)
    assert demo.DemoSettings().public()["chat_tpm"] is None and demo.DemoSettings().batch_seconds == 2.0


def test_durations_are_written_as_openai_writes_them():
    """format_duration writes Go-style durations rounded up to the millisecond."""
    cases = {
        0: "0s",
        0.02: "20ms",
        0.07: "70ms",
        0.6: "600ms",
        1: "1s",
        1.5: "1.5s",
        59.159: "59.159s",
        360: "6m0s",
        3723: "1h2m3s",
    }
    assert {seconds: format_duration(seconds) for seconds in cases} == cases


@given(st.floats(min_value=0, max_value=10 * 86400, allow_nan=False))
def test_a_formatted_duration_is_never_shorter_than_the_wait(seconds):
    """Parsing a formatted duration gives the wait rounded up to the millisecond: never early, at most 1 ms late."""
    parsed = parse_duration(format_duration(seconds))
    assert seconds - 1e-9 <= parsed + 1e-9 and parsed < seconds + 0.001 + 1e-6


def test_minute_buckets_refill_continuously_and_admit_exactly():
    """A per-minute bucket holds `seconds` worth, refills at limit/60 a second and admits at the exact wait."""
    buckets = MinuteBuckets(600, 2.0)  # 10 a second, 20 held
    assert buckets.wait("k", 0.0, 20) == 0.0
    buckets.take("k", 0.0, 20)
    assert buckets.wait("k", 0.0, 5) == pytest.approx(0.5)
    assert buckets.wait("k", 0.5, 5) == 0.0 and buckets.wait("k", 0.499, 5) > 0
    assert buckets.wait("k", 100.0, 50) == 0.0  # heavier than the bucket: fits when refilled to its weight
    assert buckets.headers("k", 1.0, "tokens") == {
        "x-ratelimit-limit-tokens": "600",
        "x-ratelimit-remaining-tokens": "10",
        "x-ratelimit-reset-tokens": "1s",
    }


def test_the_strict_checker_accepts_what_the_sdk_sends_and_names_violations():
    """check_strict accepts a strict pydantic schema and refuses open objects, missing required keys and allOf."""
    check_strict({"type": "object", "properties": {}, "required": [], "additionalProperties": False})
    refused = {
        "('properties', 'x')": {
            "type": "object",
            "properties": {"x": {"type": "object"}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "'allOf'": {
            "type": "object",
            "properties": {},
            "required": [],
            "additionalProperties": False,
            "allOf": [],
        },
        "Missing 'y'": {
            "type": "object",
            "properties": {"y": {"type": "string"}},
            "additionalProperties": False,
        },
    }
    for expected, schema in refused.items():
        with pytest.raises(SchemaError) as caught:
            check_strict(schema)
        assert expected in caught.value.describe("Answer")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_filled_values_validate_against_the_pydantic_models(prompt):
    """fill(Model.model_json_schema(), prompt) round-trips through Model.model_validate_json for any prompt."""
    for model in (Company, Node, Formats):
        value = fill(model.model_json_schema(), prompt)
        model.model_validate_json(json.dumps(value))
        assert fill(model.model_json_schema(), prompt) == value


NAMES = st.sampled_from(
    ["industry", "summary", "company_name", "website", "email", "country", "year", "score", "city", "count"]
)
LEAVES = st.one_of(
    st.just({"type": "string"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4, unique=True).map(
        lambda e: {"type": "string", "enum": e}
    ),
    st.tuples(st.integers(-50, 50), st.integers(0, 40)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}
    ),
    st.tuples(st.floats(-5, 5), st.floats(0.01, 5)).map(
        lambda t: {"type": "number", "exclusiveMinimum": t[0], "maximum": t[0] + t[1]}
    ),
    st.sampled_from(["date", "date-time", "email", "uri", "uuid", "ipv4"]).map(
        lambda f: {"type": "string", "format": f}
    ),
    st.integers().map(lambda n: {"const": n}),
)


def _containers(children):
    objects = st.dictionaries(NAMES, children, max_size=4).map(
        lambda props: {
            "type": "object",
            "properties": props,
            "required": list(props),
            "additionalProperties": False,
        }
    )
    arrays = st.tuples(children, st.integers(0, 2), st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}
    )
    nullable = children.map(lambda c: {"anyOf": [c, {"type": "null"}]})
    return st.one_of(objects, arrays, nullable)


SCHEMAS = st.recursive(LEAVES, _containers, max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(NAMES, SCHEMAS, max_size=5), st.text(max_size=80))
def test_filled_values_validate_against_generated_strict_schemas(properties, prompt):
    """Any strict schema built of the supported keywords is accepted by check_strict and filled validly."""
    schema = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    check_strict(schema)
    jsonschema.validate(fill(schema, prompt), schema, format_checker=jsonschema.FormatChecker())
