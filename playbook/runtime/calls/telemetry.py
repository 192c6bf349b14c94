"""A run in OpenTelemetry: a span per run and per call, events for holds and parks, and metrics.

Only with the ``otel`` extra installed and a tracer or meter provider configured in the process (as
OpenTelemetry users configure one: ``trace.set_tracer_provider(...)``, or the SDK's environment
variables through ``opentelemetry-instrument``).  Otherwise nothing here runs: no listener, no
observer, and the calls' path pays nothing for it.

- The run: a span ``playbook.run <play>`` (``playbook.play``, ``playbook.run_id``, ``playbook.rows``;
  at its end the rows by status and the calls and cost as ``run.stats`` counts them), with an event
  for each hold (``playbook.hold``), parked row (``playbook.parked``), key that left its pool
  (``playbook.key_retired``) and notice or fatal error (``playbook.notice``).
- A call: a span, child of the run's, from its request to its answer; ``playbook.tool``,
  ``playbook.provider``, ``playbook.row``, ``playbook.cost`` (the conventions have no attribute for
  money), ``playbook.attempt``, ``playbook.key`` (a pooled provider's key, by its label: the
  variable and the last four characters, never the key), ``playbook.reused`` /
  ``playbook.shared`` (answered by a receipt: a span of no length).
  An LLM call is named and described as OpenTelemetry's generative-AI conventions say:
  ``chat <model>``, ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``.  A request that failed has the
  status ``ERROR``.
- Metrics: ``playbook.calls`` (by ``playbook.outcome``: paid, reused, shared, failed, local),
  ``playbook.cost``, ``playbook.rows`` (by ``playbook.status``), ``playbook.rows.waiting`` (rows
  held, per provider, as they are now), ``gen_ai.client.token.usage`` and
  ``gen_ai.client.operation.duration``.

Nothing that goes wrong here (an exporter that raises) reaches the run: it goes on, and says so once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from playbook.events import (
    Event,
    KeyRetired,
    ProviderHoldSet,
    RowFinished,
    RowHeld,
    RowParked,
    RowResumed,
    RunFinished,
    RunNotice,
    RunStarted,
)
from playbook.providers.limits.weights import Tokens
from playbook.providers.pool import chosen_label
from playbook.runtime.calls.observed import Called
from playbook.runtime.state.reading import RunState
from playbook.tools.protocol import Spent, ToolEngine, is_local

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["GEN_AI_PROVIDERS", "Telemetry", "telemetry"]

_logger = logging.getLogger("playbook")

# Each LLM dialect's provider, as the generative-AI conventions name it (gen_ai.provider.name).
GEN_AI_PROVIDERS = {
    "openai": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "azure": "azure.ai.openai",
    "bedrock": "aws.bedrock",
}
_SCOPE = "playbook"
_NO_TRACES = ("ProxyTracerProvider", "NoOpTracerProvider")
_NO_METRICS = ("_ProxyMeterProvider", "NoOpMeterProvider")


def telemetry(state: RunState, parent: dict[str, str] | None = None) -> Telemetry | None:
    """The run's telemetry, when OpenTelemetry is installed and a provider is configured; else None.
    ``parent``: the trace context its run span continues (a cluster job's, as W3C headers)."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return None
    # The API hands out a proxy until a provider is set: only then is anything recorded.
    traced = type(trace.get_tracer_provider()).__name__ not in _NO_TRACES
    metered = type(metrics.get_meter_provider()).__name__ not in _NO_METRICS
    if not traced and not metered:
        return None
    return Telemetry(state, traced=traced, metered=metered, parent=parent)


class Telemetry:
    """Hears a run's events (the run span, its events, the rows) and watches its calls (their
    spans): a :class:`~playbook.runtime.calls.observed.CallObserver`."""

    def __init__(
        self, state: RunState, *, traced: bool, metered: bool, parent: dict[str, str] | None = None
    ) -> None:
        from opentelemetry import metrics, trace

        self.tracer: Tracer | None = trace.get_tracer(_SCOPE) if traced else None
        self.broken: str | None = None
        self._run: Span | None = None
        self._parent = parent
        self._paid: dict[tuple[int, str], Spent] = {}  # a paid call's answer, until its request's end
        self._tries: dict[tuple[int, str], int] = {}  # requests sent for a call not answered yet
        self._tools: dict[str, ToolEngine] = {}  # the tools of the paid calls waiting in _paid
        self._tally: dict[
            tuple[str, str | None, str], list[float]
        ] = {}  # calls not added to the counters yet
        self._next_tally = 0.0
        self._settled: dict[str, int] = {}  # rows by status, not added to their counter yet
        self._parks: dict[tuple[str, str], list[float]] = {}  # (reason, provider) -> [rows, latest ready]
        self._waiting: dict[int, str] = {}  # rows held now: position -> provider
        self._state = state
        self._instruments(metrics.get_meter(_SCOPE) if metered else None)
        self._unsubscribe = state.subscribe(self._heard, kinds=_KINDS)

    def __repr__(self) -> str:
        return f"<Telemetry traced={self.tracer is not None} metered={self._calls is not None}>"

    def _instruments(self, meter: Any) -> None:
        if meter is None:
            self._calls = self._cost = self._rows = self._tokens = self._duration = None
            return
        self._calls = meter.create_counter("playbook.calls", unit="{call}", description="calls by outcome")
        self._cost = meter.create_counter("playbook.cost", description="what the paid calls cost")
        self._rows = meter.create_counter(
            "playbook.rows", unit="{row}", description="rows settled, by status"
        )
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="tokens of an LLM call"
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="an LLM call's time"
        )
        meter.create_observable_gauge(
            "playbook.rows.waiting",
            callbacks=[self._held_now],
            unit="{row}",
            description="rows held, per provider",
        )

    def follow(self, state: RunState) -> None:
        """A retry: its state from now on, under a run span of its own."""
        self._unsubscribe()
        self._state = state
        self._unsubscribe = state.subscribe(self._heard, kinds=_KINDS)

    # -- the run's events -------------------------------------------------------------------

    def _heard(self, event: Event) -> None:
        if self.broken is not None:
            return
        try:
            _ON[type(event)](self, event)
        except Exception as exc:  # an exporter's failure, or ours: never the run's
            self._broke(exc)

    def _broke(self, exc: Exception) -> None:
        self.broken = f"OpenTelemetry: {type(exc).__name__}: {exc}; the run went on without it from then on"
        _logger.warning("%s", self.broken)
        self._state.notices.append(self.broken)

    def carrier(self) -> dict[str, str]:
        """The run span's context as W3C trace headers, for the partitions a cluster job sends."""
        from opentelemetry import propagate, trace

        headers: dict[str, str] = {}
        if self._run is not None:
            propagate.inject(headers, context=trace.set_span_in_context(self._run))
        return headers

    def _started(self, event: RunStarted) -> None:
        if self.tracer is not None:
            from opentelemetry import propagate

            within = propagate.extract(self._parent) if self._parent else None
            self._run = self.tracer.start_span(
                f"playbook.run {event.play}",
                context=within,
                attributes={
                    "playbook.play": event.play,
                    "playbook.run_id": event.run_id,
                    "playbook.rows": event.total,
                },
            )

    def _finished(self, event: RunFinished) -> None:
        for key in list(self._paid):
            self._untimed(key)
        self._tries.clear()
        self._add_tally()
        self._say_parks()
        span, self._run = self._run, None
        if span is None:
            return
        stats = self._state.stats()
        span.set_attributes(
            {
                **{
                    f"playbook.rows.{s}": getattr(stats, s)
                    for s in ("ok", "reused", "failed", "parked", "skipped")
                },
                "playbook.calls.paid": stats.calls_executed,
                "playbook.calls.reused": stats.calls_reused,
                "playbook.calls.shared": stats.calls_shared,
                "playbook.calls.failed": stats.calls_failed,
                "playbook.cost.spent": stats.cost_spent,
                "playbook.cost.saved": stats.cost_saved,
                "playbook.stopped": event.stopped,
            }
        )
        span.end()

    def _row(self, event: RowFinished) -> None:
        self._waiting.pop(event.position, None)
        self._settled[event.status] = self._settled.get(event.status, 0) + event.copies

    def _held(self, event: RowHeld) -> None:
        self._waiting[event.position] = event.provider

    def _resumed(self, event: RowResumed) -> None:
        self._waiting.pop(event.position, None)

    def _parked(self, event: RowParked) -> None:
        # Grouped, said once per group when the run ends: a span keeps 128 events, and a run can
        # park thousands of rows behind one hold.
        group = self._parks.setdefault((event.reason, event.provider or ""), [0, 0.0])
        group[0] += 1
        group[1] = max(group[1], event.ready_at or 0.0)

    def _say_parks(self) -> None:
        parks, self._parks = self._parks, {}
        for (reason, provider), (rows, ready_at) in parks.items():
            said = {"playbook.reason": reason, "playbook.provider": provider, "playbook.rows": rows}
            self._event("playbook.parked", {**said, "playbook.ready_at": ready_at})

    def _hold(self, event: ProviderHoldSet) -> None:
        said: dict[str, Any] = {"playbook.provider": event.provider, "playbook.until": event.until}
        if event.status is not None:
            said["http.response.status_code"] = event.status
        self._event("playbook.hold", said)

    def _retired(self, event: KeyRetired) -> None:
        self._event(
            "playbook.key_retired",
            {"playbook.provider": event.provider, "playbook.key": event.key, "playbook.why": event.why},
        )

    def _notice(self, event: RunNotice) -> None:
        self._event("playbook.notice", {"playbook.message": event.message, "playbook.lost": event.lost})

    def _event(self, name: str, attributes: dict[str, Any]) -> None:
        if self._run is not None:
            self._run.add_event(name, attributes)

    def _held_now(self, options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        counts: dict[str, int] = {}
        for provider in list(self._waiting.values()):
            counts[provider] = counts.get(provider, 0) + 1
        return [Observation(n, {"playbook.provider": p}) for p, n in counts.items()]

    # -- the calls (a CallObserver) -----------------------------------------------------------

    def called(self, position: int, tool: ToolEngine, occurrence: tuple[str, int], call: Called) -> None:
        pass

    def counted(
        self, position: int, tool: ToolEngine, reused: bool, spent: Spent, shared: bool = False
    ) -> None:
        if self.broken is not None:
            return
        try:
            if reused or is_local(tool, spent.cost):
                outcome = "local" if not reused else ("shared" if shared else "reused")
                now = time.time_ns()
                self._call(position, tool, spent, outcome, now, now, failed=False)
            else:  # its span ends with its request (sent)
                key = (position, tool.name)
                self._tools[tool.name] = tool
                if key in self._paid:  # the one before it was answered with no request of its own
                    self._untimed(key)
                self._paid[key] = spent
        except Exception as exc:
            self._broke(exc)

    def began(self, position: int, tool: ToolEngine) -> float:
        key = (position, tool.name)
        self._tries[key] = self._tries.get(key, 0) + 1  # a retry of the call is its next attempt
        return time.monotonic()

    def sent(
        self,
        position: int,
        tool: ToolEngine,
        began: float,
        *,
        failed: bool,
        refused: bool = False,
        status: int | None = None,
    ) -> None:
        if self.broken is not None:
            return
        try:
            key = (position, tool.name)
            spent = self._paid.pop(key, None)
            attempt = self._tries.get(key, 1) if failed else self._tries.pop(key, 1)
            if spent is None and not failed:
                return  # a local tool: counted already
            now = time.time_ns()
            start = now - int((time.monotonic() - began) * 1e9)
            said: dict[str, Any] = {"playbook.attempt": attempt}
            label = chosen_label()  # a pooled provider's key, as its panel and events name it
            if label is not None:
                said["playbook.key"] = label
            if status is not None:
                said["http.response.status_code"] = status
            outcome = "failed" if failed else "paid"
            self._call(position, tool, spent or _NOTHING, outcome, start, now, failed=failed, said=said)
        except Exception as exc:
            self._broke(exc)

    def _untimed(self, key: tuple[int, str]) -> None:
        """A paid call whose request was not its own (a member of a batch, an answer of a batch job):
        a span of no length, counted as paid."""
        spent = self._paid.pop(key)
        tool = self._tools[key[1]]
        now = time.time_ns()
        self._call(key[0], tool, spent, "paid", now, now, failed=False, said={"playbook.batched": True})

    def _call(
        self,
        position: int,
        tool: ToolEngine,
        spent: Spent,
        outcome: str,
        start: int,
        end: int,
        *,
        failed: bool,
        said: dict[str, Any] | None = None,
    ) -> None:
        provider = tool.provider.name if tool.provider is not None else None
        attributes: dict[str, Any] = {
            "playbook.tool": tool.name,
            "playbook.row": position,
            "playbook.outcome": outcome,
        }
        if provider is not None:
            attributes["playbook.provider"] = provider
        if outcome != "failed" and spent.cost is not None:
            attributes["playbook.cost"] = spent.cost
        attributes["playbook.reused"] = outcome in ("reused", "shared")
        attributes["playbook.shared"] = outcome == "shared"
        if said:
            attributes.update(said)
        name = f"call {tool.name}"
        model = getattr(tool, "model", None)
        dialect = getattr(getattr(tool, "dialect", None), "name", None)
        llm = model is not None and dialect in GEN_AI_PROVIDERS
        if llm:
            name = f"chat {model}"
            attributes["gen_ai.operation.name"] = "chat"
            attributes["gen_ai.provider.name"] = GEN_AI_PROVIDERS[dialect]  # type: ignore[index]
            attributes["gen_ai.request.model"] = model
            tokens = spent.tokens
            if isinstance(tokens, Tokens):  # the answer's usage, input and output apart
                attributes["gen_ai.usage.input_tokens"] = int(tokens.input)
                attributes["gen_ai.usage.output_tokens"] = int(tokens.output)
        # Under a run span the sampler left out, so are its calls (the standard samplers decide per
        # trace): none is made, at no cost per call.
        if self.tracer is not None and self._run is not None and self._run.is_recording():
            from opentelemetry import trace
            from opentelemetry.trace import Status, StatusCode

            parent = trace.set_span_in_context(self._run)
            span = self.tracer.start_span(name, context=parent, start_time=start, attributes=attributes)
            if failed:
                span.set_status(Status(StatusCode.ERROR, "the request brought back nothing to keep"))
            span.end(end_time=end)
        self._measure(attributes, spent, outcome, (end - start) / 1e9, llm)

    def _measure(
        self, attributes: dict[str, Any], spent: Spent, outcome: str, seconds: float, llm: bool
    ) -> None:
        tokens, duration = self._tokens, self._duration
        if tokens is None or duration is None:
            return
        # Counted here, added to the counters a few times a second (and at the run's end): the
        # sums are the same, at a dictionary's cost per call rather than the SDK's.
        line = self._tally.get((attributes["playbook.tool"], attributes.get("playbook.provider"), outcome))
        if line is None:
            line = self._tally[
                (attributes["playbook.tool"], attributes.get("playbook.provider"), outcome)
            ] = [0, 0.0]
        line[0] += 1
        if outcome == "paid" and spent.cost:
            line[1] += spent.cost
        now = time.monotonic()
        if now >= self._next_tally:
            self._add_tally(now)
        if outcome == "paid" and llm:
            gen = {k: v for k, v in attributes.items() if k in _GEN_AI_KEYS}
            if not attributes.get("playbook.batched"):
                duration.record(seconds, gen)
            for kind in ("input", "output"):
                used = attributes.get(f"gen_ai.usage.{kind}_tokens")
                if used is not None:
                    tokens.record(used, {**gen, "gen_ai.token.type": kind})

    def _add_tally(self, now: float | None = None) -> None:
        calls, cost, rows = self._calls, self._cost, self._rows
        self._next_tally = (time.monotonic() if now is None else now) + _TALLY_EVERY
        tally, self._tally = self._tally, {}
        settled, self._settled = self._settled, {}
        if calls is None or cost is None or rows is None:
            return
        for status, copies in settled.items():
            rows.add(copies, {"playbook.status": status})
        for (tool, provider, outcome), (n, money) in tally.items():
            keys = (
                {"playbook.tool": tool}
                if provider is None
                else {"playbook.tool": tool, "playbook.provider": provider}
            )
            calls.add(n, {**keys, "playbook.outcome": outcome})
            if money:
                cost.add(money, keys)


_TALLY_EVERY = 0.5  # seconds between additions to the call counters
_NOTHING = Spent(None, None, 1)  # a request that failed: no answer, nothing spent
_GEN_AI_KEYS = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")
_ON: dict[type, Any] = {
    RunStarted: Telemetry._started,
    RunFinished: Telemetry._finished,
    RowFinished: Telemetry._row,
    RowHeld: Telemetry._held,
    RowResumed: Telemetry._resumed,
    RowParked: Telemetry._parked,
    ProviderHoldSet: Telemetry._hold,
    KeyRetired: Telemetry._retired,
    RunNotice: Telemetry._notice,
}
_KINDS = tuple(_ON)
