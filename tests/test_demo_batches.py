"""The demo's Anthropic and Gemini batch endpoints driven by the official SDKs (``anthropic``,
``google-genai``): a batch made, followed until it ends, and its answers read as each SDK reads
them, the same answers the online endpoints give."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient
from vtime import FrozenClock

from playbook import demo

anthropic = pytest.importorskip("anthropic")
genai = pytest.importorskip("google.genai")

CLOCK = FrozenClock(6000.0)
PROMPT = "Classify this company: Acme Robotics"


@pytest.fixture(scope="module")
def server() -> Any:
    with demo.serve(clock=CLOCK, in_process=True) as running:
        yield running


@pytest.fixture
def provider(server: Any) -> Any:
    server.reset(batch_seconds=60.0)
    return server


def _http(provider: Any) -> TestClient:
    return TestClient(provider.app, base_url=provider.url)


def test_the_anthropic_sdk_makes_follows_and_reads_a_message_batch(provider: Any) -> None:
    """Message Batches: in progress until batch_seconds pass, then ended; its results as the SDK streams them (the online answer;
    an empty prompt errored); the listing holds it."""
    client = anthropic.Anthropic(
        api_key=demo.DEMO_KEY, base_url=provider.url, max_retries=0, http_client=_http(provider)
    )
    params = {"model": "claude-sonnet-4-5", "max_tokens": 100}
    batch = client.messages.batches.create(
        requests=[
            {"custom_id": "asked", "params": {**params, "messages": [{"role": "user", "content": PROMPT}]}},
            {"custom_id": "empty", "params": {**params, "messages": [{"role": "user", "content": ""}]}},
        ]
    )
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 2
    CLOCK.now += 61.0
    ended = client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended" and ended.request_counts.succeeded == 1
    assert ended.request_counts.errored == 1 and ended.results_url
    results = {line.custom_id: line.result for line in client.messages.batches.results(batch.id)}
    online = client.messages.create(**params, messages=[{"role": "user", "content": PROMPT}])
    assert results["asked"].type == "succeeded" and results["asked"].message.content == online.content
    assert results["empty"].type == "errored"
    assert [b.id for b in client.messages.batches.list(limit=10).data] == [batch.id]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("msgbatch_none")


def test_the_gemini_sdk_makes_follows_and_reads_a_batch_job(provider: Any) -> None:
    """Gemini batch mode: pending, then running, then succeeded; its inlined responses as the SDK reads them (the online answer),
    each with its request's metadata; the listing holds it."""
    from google.genai import types

    # v1beta, as the REST reference has batches: on the demo's one host /v1/batches is OpenAI's.
    options = types.HttpOptions(base_url=provider.url, api_version="v1beta", httpx_client=_http(provider))
    client = genai.Client(api_key=demo.DEMO_KEY, http_options=options)
    contents = [{"role": "user", "parts": [{"text": PROMPT}]}]
    job = client.batches.create(
        model="gemini-2.5-flash",
        src=[{"contents": contents, "metadata": {"key": "asked"}}],
        config={"display_name": "playbook-test"},
    )
    assert job.state is not None and job.state.name == "JOB_STATE_PENDING"
    CLOCK.now += 30.0
    assert client.batches.get(name=job.name).state.name == "JOB_STATE_RUNNING"
    CLOCK.now += 31.0
    done = client.batches.get(name=job.name)
    assert done.state.name == "JOB_STATE_SUCCEEDED" and done.display_name == "playbook-test"
    answered = done.dest.inlined_responses
    online = client.models.generate_content(model="gemini-2.5-flash", contents=contents)
    assert len(answered) == 1 and answered[0].response.text == online.text
    assert [b.name for b in client.batches.list()] == [job.name]
