"""A run in OpenTelemetry: with a tracer and a meter provider configured (in-memory exporters here),
a run emits a span per run and per call, events for holds and parks, and metrics, which agree with
``run.stats``; with none configured, nothing is attached to the run."""

from __future__ import annotations

import collections
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import opentelemetry.metrics._internal as metrics_internal
import opentelemetry.trace as trace_api
import pandas as pd
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.util._once import Once

import playbook as pb
from playbook.runtime.run import scheduler


class Exported:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], float]]]:
        found: dict[str, list[tuple[dict[str, Any], float]]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found[metric.name] = [
                        (dict(p.attributes or {}), getattr(p, "value", None) or getattr(p, "sum", 0))
                        for p in metric.data.data_points
                    ]
        return found


def _reset() -> None:
    # The API sets its global providers once per process; the tests of one worker set them in turn.
    trace_api._TRACER_PROVIDER_SET_ONCE = Once()
    trace_api._TRACER_PROVIDER = None
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None


@pytest.fixture
def exported() -> Iterator[Exported]:
    """In-memory span and metric exporters as the process's providers, for this test only."""
    out = Exported()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(out.spans))
    _reset()
    trace.set_tracer_provider(tracing)
    metrics.set_meter_provider(MeterProvider(metric_readers=[out.reader]))
    yield out
    _reset()


def _play(demo: pb.demo.DemoServer, provider: str) -> pb.Play:
    email = pb.demo.email_tool(demo, provider=pb.Provider(provider, concurrency=2, max_wait=5), cost=0.25)
    chat = pb.llm_tool(
        "chat",
        model="demo-mini",
        base_url=demo.url + "/v1",
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
    )

    async def play(row: Any, ctx: Any) -> dict[str, Any]:
        found = await ctx.tool(email, domain=row.domain, first=row.first)
        return {"email": found, "line": await ctx.tool(chat, prompt=f"about {row.domain}")}

    return pb.play(play, name="told")


def _frame(rows: int = 40) -> pd.DataFrame:
    """``rows`` rows, every 4th asking what the row 3 before asked."""
    domains = [f"d{i - 3 if i % 4 == 3 else i}.com" for i in range(rows)]
    return pd.DataFrame({"domain": domains, "first": ["a"] * rows})


def test_no_provider_configured_attaches_nothing(tmp_path: Path, demo: pb.demo.DemoServer) -> None:
    """With no tracer or meter provider set, a run has no telemetry and its calls no observer."""
    _reset()
    run = _frame().play.run(_play(demo, "quiet"), store=tmp_path, progress=False)
    assert run.telemetry is None and scheduler(run).scope.observer is None


def test_spans_and_metrics_agree_with_the_run(
    tmp_path: Path, demo: pb.demo.DemoServer, exported: Exported
) -> None:
    """2,000 rows: a quota used up past max_wait (rows park), an LLM column and repeated calls: a call
    span per request (paid or failed) under the run's span, the GenAI conventions' attribute names on
    the LLM's, hold and park events, and metrics whose counts, cost, tokens and rows equal ``run.stats``."""
    demo.reset(quota=400, quota_reset=3600)
    run = _frame(2000).play.run(_play(demo, "quota-otel"), store=tmp_path, progress=False)
    stats = run.stats
    spans = exported.spans.get_finished_spans()
    [root] = [s for s in spans if s.name == "playbook.run told"]
    calls = [s for s in spans if s is not root]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in calls)
    outcomes = collections.Counter(s.attributes["playbook.outcome"] for s in calls)
    assert outcomes["paid"] == stats.calls_executed and outcomes["failed"] == stats.calls_failed
    assert root.attributes["playbook.calls.paid"] == stats.calls_executed
    failed = [s for s in calls if s.attributes["playbook.outcome"] == "failed"]
    assert failed and {s.attributes.get("http.response.status_code") for s in failed} == {429}
    assert all(s.status.status_code.name == "ERROR" and s.attributes["playbook.attempt"] >= 1 for s in failed)
    assert root.attributes["playbook.rows.parked"] == stats.parked > 0
    events = collections.Counter(e.name for e in root.events)
    assert events["playbook.hold"] >= 1
    parks = [e.attributes for e in root.events if e.name == "playbook.parked"]
    assert sum(p["playbook.rows"] for p in parks) <= stats.parked  # rows of one id park as one
    assert {p["playbook.provider"] for p in parks} == {h.provider for h in run.waiting_on}
    llm = [s for s in calls if s.name == "chat demo-mini" and s.attributes["playbook.outcome"] == "paid"]
    assert llm and all(
        s.attributes[gen_ai.GEN_AI_OPERATION_NAME] == gen_ai.GenAiOperationNameValues.CHAT.value
        and s.attributes[gen_ai.GEN_AI_PROVIDER_NAME] == gen_ai.GenAiProviderNameValues.OPENAI.value
        and s.attributes[gen_ai.GEN_AI_REQUEST_MODEL] == "demo-mini"
        and s.end_time > s.start_time
        for s in llm
    )
    used = sum(
        s.attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] + s.attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS]
        for s in llm
    )
    assert used == stats.tokens
    paid = [s for s in calls if s.attributes["playbook.outcome"] == "paid"]
    assert round(sum(s.attributes.get("playbook.cost", 0.0) for s in paid), 9) == stats.cost_spent > 0

    measured = exported.metrics()
    by_outcome = collections.Counter()
    for attributes, value in measured["playbook.calls"]:
        by_outcome[attributes["playbook.outcome"]] += value
    assert by_outcome["paid"] == stats.calls_executed and by_outcome["failed"] == stats.calls_failed
    usage = measured[gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE]
    assert sum(value for _, value in usage) == stats.tokens
    assert {a[gen_ai.GEN_AI_TOKEN_TYPE] for a, _ in usage} == {"input", "output"}
    assert gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION in measured
    assert round(sum(value for _, value in measured["playbook.cost"]), 9) == stats.cost_spent
    rows = {a["playbook.status"]: v for a, v in measured["playbook.rows"]}
    assert rows == {s: getattr(stats, s) for s in ("ok", "parked") if getattr(stats, s)}


def test_an_exporter_that_fails_costs_the_run_nothing(tmp_path: Path, demo: pb.demo.DemoServer) -> None:
    """A span processor that raises: every row ends as it would, and the run says its telemetry stopped."""

    class Broken(SimpleSpanProcessor):
        def on_end(self, span: Any) -> None:
            raise RuntimeError("collector gone")

    tracing = TracerProvider()
    tracing.add_span_processor(Broken(InMemorySpanExporter()))
    _reset()
    trace.set_tracer_provider(tracing)
    try:
        run = _frame().play.run(_play(demo, "broken-otel"), store=tmp_path, progress=False)
    finally:
        _reset()
    assert run.stats.ok == 40 and run.stats.failed == 0
    assert any("OpenTelemetry: RuntimeError: collector gone" in n for n in run.notices)


# -- OTLP over HTTP, and a Dask job's partitions under the job's trace --------------------------


class Receiver:
    """An OTLP/HTTP receiver on loopback: what it is sent, decoded (protobuf, as the exporter sends)."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[Any] = []
        received = self.spans

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            received.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _export_to(endpoint: str) -> None:
    """This process's tracer provider: spans sent over OTLP/HTTP to ``endpoint`` as each ends."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    _reset()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint + "/v1/traces")))
    trace.set_tracer_provider(tracing)


def test_a_dask_job_s_partitions_are_traced_under_the_job_over_otlp(
    demo_loopback: pb.demo.DemoServer, redis_url: str, dask_client: Any
) -> None:
    """The client and each worker send their spans over OTLP/HTTP to a receiver: the job's span on the
    client, each partition's run span its child on a worker (one trace), each paid call under its
    partition's; as many paid call spans as the job's stats count."""
    import dask.dataframe as dd

    receiver = Receiver()
    try:
        _export_to(receiver.url)
        dask_client.run(_export_to, receiver.url)
        play = _play(demo_loopback, "traced-job")
        job = dd.from_pandas(_frame(), npartitions=4).play.run(play, store=redis_url, progress=False)
        stats = job.stats
    finally:
        dask_client.run(_reset)
        _reset()
        receiver.close()
    spans = receiver.spans
    [root] = [s for s in spans if s.name == "playbook.run told" and not s.parent_span_id]
    parts = [s for s in spans if s.name == "playbook.run told" and s.parent_span_id == root.span_id]
    assert len(parts) == 4 and {s.trace_id for s in spans} == {root.trace_id}
    part_ids = {s.span_id for s in parts}
    calls = [s for s in spans if s.name.startswith(("call ", "chat "))]
    assert calls and all(s.parent_span_id in part_ids for s in calls)
    paid = [
        s
        for s in calls
        if any(a.key == "playbook.outcome" and a.value.string_value == "paid" for a in s.attributes)
    ]
    assert len(paid) == stats.calls_executed > 0


def test_calls_answered_in_batches_are_counted_and_traced(tmp_path: Path, exported: Exported) -> None:
    """A tool that answers 10 rows' calls in one request (``batch_size``): each call is a paid span
    (of no length, ``playbook.batched``) and counted in ``playbook.calls``, as ``run.stats`` counts it."""

    @pb.tool(provider=pb.Provider("bulk-otel"), batch_size=10, cost=0.5)
    async def lookup(items: list[int]) -> list[int]:
        return [n * 10 for n in items]

    async def play(row: Any, ctx: Any) -> dict[str, Any]:
        first = await ctx.tool(lookup, row.n)
        return {"v": first, "w": await ctx.tool(lookup, row.n + 1000)}  # the same tool twice in a row

    run = pd.DataFrame({"n": range(30)}).play.run(pb.play(play, name="bulk"), store=tmp_path, progress=False)
    stats = run.stats
    assert stats.calls_executed == 60 and stats.ok == 30
    paid = [s for s in exported.spans.get_finished_spans() if s.name == "call lookup"]
    assert len(paid) == stats.calls_executed and all(s.attributes["playbook.batched"] for s in paid)
    assert round(sum(s.attributes["playbook.cost"] for s in paid), 9) == stats.cost_spent
    calls = sum(v for a, v in exported.metrics()["playbook.calls"] if a["playbook.outcome"] == "paid")
    assert calls == stats.calls_executed


def test_a_pooled_provider_s_calls_name_their_key_by_its_label(
    tmp_path: Path, exported: Exported, demo: pb.demo.DemoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request of a provider with several keys says which key it went under, as the panel and
    the events name it (the variable and its last four characters), and never the key itself."""
    keys = {"OTEL_KEY_A": "sk-aaaaaaaaaaaa-A1b2", "OTEL_KEY_B": "sk-bbbbbbbbbbbb-C3d4"}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    demo.configure(api_keys=tuple(keys.values()))
    pooled = pb.Provider("pooled-otel", keys=[pb.secret(name) for name in keys], rps=[50, 50])
    lookup = pb.http_tool(
        "pooled.email",
        provider=pooled,
        method="GET",
        url=demo.url + "/v1/email",
        params={"domain": "{domain}", "first": "a", "last": "b"},
        headers={"Authorization": "Bearer {secret}"},
        pick="email",
        miss_status=(404,),
        cost=0.1,
    )
    frame = pd.DataFrame({"domain": [f"d{i}.com" for i in range(40)]})
    run = frame.play.run(lookup, store=tmp_path, progress=False)
    assert run.stats.calls_executed == 40 and run.stats.ok == 40
    spans = [s for s in exported.spans.get_finished_spans() if s.name == "call pooled.email"]
    labels = Counter(s.attributes["playbook.key"] for s in spans)
    assert set(labels) == {"OTEL_KEY_A …A1b2", "OTEL_KEY_B …C3d4"} and sum(labels.values()) == 40
    assert not any(value in str(dict(s.attributes)) for s in spans for value in keys.values())
