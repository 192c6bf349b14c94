"""Python tools that wrap SDKs: their HTTP errors are classified like HTTP answers, their dropped
connections retried, ``retry_on=`` adds types.

The first tests drive the real ``openai`` package against the demo's chat endpoint; the rest raise
real SDK exceptions (httpx, requests, openai) from async tools in virtual time (``vtime``), so a
30 s ``Retry-After`` passes at once and each test asserts the times the governor chose.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pandas as pd
import pytest
import requests
from vtime import run_virtual

import playbook as pb
from playbook.events import RowHeld
from playbook.runtime.calls.pipeline import invoke
from playbook.tools import CallEnv, engine_of

openai = pytest.importorskip("openai")

COMPANIES = pd.DataFrame({"company": [f"Company {i}" for i in range(20)]})
CHAT_URL = "https://api.example/v1/chat/completions"


def _ask(client: Any) -> Callable[[str], Any]:
    async def ask(company: str) -> str:
        reply = await client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": f"Classify: {company}"}]
        )
        return reply.choices[0].message.content

    return ask


def _sdk(demo: pb.demo.DemoServer, api_key: str = "demo-key") -> Any:
    """The openai SDK's async client of the demo served in process (its own HTTP client, sent
    through the app: the SDK does not see the runs' transports)."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=demo.app))
    return openai.AsyncOpenAI(base_url=demo.url + "/v1", api_key=api_key, max_retries=0, http_client=http)


def now() -> float:
    return asyncio.get_running_loop().time()


def _map(frame: pd.DataFrame, tool: pb.Tool, store: pb.ReceiptStore, **opts: Any) -> pd.DataFrame:
    return frame.play.map(tool, store=store, progress=False, **opts)


# -- the real openai SDK against the demo provider ----------------------------------------------


def test_openai_rate_limits_are_held_and_honoured(demo, store) -> None:
    """openai.RateLimitError from a 429 holds the provider for its Retry-After: all 20 rows end ok, no call goes out during a hold."""
    demo.reset(rps=20, burst=5)
    starts: list[float] = []
    refusals: list[tuple[float, float]] = []  # (when the 429 came, the Retry-After it carried)

    async def main() -> pd.DataFrame:
        async with _sdk(demo) as client:
            ask = _ask(client)

            @pb.tool(provider=pb.Provider("llm"))
            async def label(company: str) -> str:
                starts.append(now())
                try:
                    return await ask(company)
                except openai.RateLimitError as exc:
                    refusals.append((now(), float(exc.response.headers["retry-after"])))
                    raise

            return await COMPANIES.play.amap(label, store=store, progress=False)

    out = run_virtual(main())  # on the loop's clock, the provider's too
    assert out["play_status"].tolist() == ["ok"] * 20, out["play_error"].dropna().head()
    stats = demo.stats()
    assert stats["by_status"]["200"] == 20 and stats["rate_limited"] == len(refusals) > 0
    early = [(t, s) for t, wait in refusals for s in starts if t < s < t + wait - 0.05]
    assert early == []  # no call went out before the wait a 429 asked for was over


def test_openai_5xx_is_retried(demo, store) -> None:
    """openai.InternalServerError (a 503) is retried: the row ends ok on the second try."""
    demo.reset(fault_rate=1.0, fault_status=503)
    failures: list[str] = []

    async def main() -> pd.DataFrame:
        async with _sdk(demo) as client:
            ask = _ask(client)

            @pb.tool(provider=pb.Provider("llm"))
            async def label(company: str) -> str:
                try:
                    return await ask(company)
                except openai.InternalServerError as exc:
                    failures.append(str(exc))
                    demo.configure(fault_rate=0.0)  # the outage is over
                    raise

            return await COMPANIES.head(1).play.amap(label, store=store, progress=False)

    out = run_virtual(main())
    assert out["play_status"].tolist() == ["ok"]
    assert len(failures) == 1 and demo.stats()["by_status"] == {"200": 1, "503": 1}


def test_openai_bad_key_stops_the_run(demo, store) -> None:
    """openai.AuthenticationError (401) raises RunFatal naming the tool and the SDK's error; no row runs after it."""

    async def main() -> pd.DataFrame:
        async with _sdk(demo, api_key="wrong-key") as client:
            label = pb.tool(_ask(client), name="label", provider=pb.Provider("llm"))
            return await COMPANIES.head(5).play.amap(label, store=store, progress=False, concurrency=1)

    with pytest.raises(
        pb.RunFatal, match=r"tool 'label': openai\.AuthenticationError: Error code: 401"
    ) as caught:
        run_virtual(main())
    assert (caught.value.tool, caught.value.provider, caught.value.status) == ("label", "llm", 401)
    assert isinstance(caught.value.__cause__, openai.AuthenticationError)
    assert demo.stats()["requests"] == 1
    assert set(pb.last_run().result["play_status"]) == {"failed", "skipped"}


# -- SDK exceptions in virtual time ---------------------------------------------------------------


def _httpx_refusal(status: int, headers: dict[str, str]) -> Exception:
    response = httpx.Response(
        status, headers=headers, request=httpx.Request("GET", "https://api.example/v1/x")
    )
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return exc
    raise AssertionError("raise_for_status() did not raise")


def _requests_refusal(status: int, headers: dict[str, str]) -> Exception:
    response = requests.Response()
    response.status_code, response.url, response.reason = status, "https://api.example/v1/x", "Refused"
    response.headers.update(headers)
    try:
        response.raise_for_status()
    except requests.HTTPError as exc:
        return exc
    raise AssertionError("raise_for_status() did not raise")


def _openai_refusal(status: int, headers: dict[str, str]) -> Exception:
    response = httpx.Response(status, headers=headers, request=httpx.Request("POST", CHAT_URL))
    kind = {429: openai.RateLimitError, 401: openai.AuthenticationError, 400: openai.BadRequestError}.get(
        status, openai.InternalServerError
    )
    return kind(f"Error code: {status} - {{'error': 'refused'}}", response=response, body=None)


class VendorError(Exception):
    """An in-house SDK's error: no known type, only the attributes an HTTP error carries."""

    def __init__(self, status_code: int, headers: dict[str, str]) -> None:
        super().__init__(f"vendor refused with {status_code}")
        self.status_code = status_code
        self.headers = headers


REFUSALS = {
    "httpx": _httpx_refusal,
    "requests": _requests_refusal,
    "openai": _openai_refusal,
    "duck-typed": VendorError,
}


def _flaky(errors: list[Exception], **options: Any) -> tuple[pb.Tool, list[float]]:
    """An async tool ``lookup(n)`` that raises ``errors`` in turn, then answers; logs the loop time of each try."""
    tries: list[float] = []

    async def lookup(n: int) -> str:
        tries.append(asyncio.get_running_loop().time())
        if len(tries) <= len(errors):
            raise errors[len(tries) - 1]
        return f"found{n}"

    options.setdefault("provider", pb.Provider("p"))
    return pb.tool(lookup, **options), tries


def _run(tool: pb.Tool, store: pb.ReceiptStore, rows: int = 1) -> tuple[pb.Run, list[Any]]:
    """Run ``tool`` over ``rows`` rows in virtual time; returns the run and its events."""

    async def main() -> tuple[pb.Run, list[Any]]:
        run = await pd.DataFrame({"n": range(rows)}).play.arun(
            tool, store=store, progress=False, background=True
        )
        events: list[Any] = []
        run.state.subscribe(events.append)
        await run._task
        return run, events

    return run_virtual(main())


@pytest.mark.parametrize("sdk", list(REFUSALS))
def test_a_429_with_retry_after_holds_the_provider(sdk: str, store) -> None:
    """An SDK's 429 with a 30 s Retry-After (Retry-After-Ms for openai) holds the row until then, then it ends ok."""
    headers = {"retry-after-ms": "30000", "retry-after": "99"} if sdk == "openai" else {"Retry-After": "30"}
    tool, tries = _flaky([REFUSALS[sdk](429, headers)])
    run, events = _run(tool, store)
    assert run.result["play_status"].tolist() == ["ok"] and run.result["lookup"].tolist() == ["found0"]
    assert tries == [0.0, 30.0]
    assert [e.status for e in events if isinstance(e, RowHeld)] == [429]


@pytest.mark.parametrize("sdk", list(REFUSALS))
def test_a_5xx_is_retried_and_a_4xx_is_final(sdk: str, store) -> None:
    """An SDK's 503 is retried (after a backoff) until the call goes through; its 400 fails the row after one try, naming the tool."""
    tool, tries = _flaky([REFUSALS[sdk](503, {}), REFUSALS[sdk](503, {})])
    run, _ = _run(tool, store)
    assert run.result["play_status"].tolist() == ["ok"] and len(tries) == 3 and 0 < tries[1] < tries[2] < 5

    final, tries = _flaky([REFUSALS[sdk](400, {})], name="final")
    run, _ = _run(final, store)
    assert run.result["play_status"].tolist() == ["failed"] and len(tries) == 1
    assert run.result["play_error"].iloc[0].startswith("ToolError: tool 'final': ")


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        requests.ConnectionError("connection reset by peer"),
        requests.Timeout("read timed out"),
        openai.APIConnectionError(request=httpx.Request("POST", CHAT_URL)),
        openai.APITimeoutError(request=httpx.Request("POST", CHAT_URL)),
    ],
    ids=lambda error: type(error).__module__.partition(".")[0] + "." + type(error).__name__,
)
def test_sdk_connection_errors_are_retried(error: Exception, store) -> None:
    """An SDK's dropped connection or timeout is retried like HTTP's: the row ends ok on the next try."""
    tool, tries = _flaky([error])
    run, _ = _run(tool, store)
    assert run.result["play_status"].tolist() == ["ok"] and len(tries) == 2


def test_sdk_errors_become_tool_errors_that_name_the_tool_and_chain_the_original() -> None:
    """The translated error says 'tool <name>: <sdk type>: <message>', carries status and wait, and its cause is the SDK's error."""
    original = _openai_refusal(429, {"retry-after-ms": "1500", "retry-after": "2"})

    async def label(company: str) -> str:
        raise original

    tool = pb.tool(label, provider=pb.Provider("llm"))
    with pytest.raises(pb.ToolError) as caught:
        asyncio.run(invoke(engine_of(tool), {"company": "Acme"}, CallEnv(lambda: None, "key")))  # type: ignore[arg-type, return-value]
    error = caught.value
    assert str(error) == "tool 'label': openai.RateLimitError: Error code: 429 - {'error': 'refused'}"
    assert (error.tool, error.provider, error.status, error.retryable, error.retry_after) == (
        "label",
        "llm",
        429,
        True,
        1.5,
    )
    assert error.__cause__ is original


def test_sdk_bad_credentials_are_fatal(store) -> None:
    """A 401 from any SDK stops the run with RunFatal naming the tool, after one try."""
    tool, tries = _flaky([_httpx_refusal(401, {})], name="enrich")
    with pytest.raises(
        pb.RunFatal, match=r"tool 'enrich': httpx\.HTTPStatusError: Client error '401 Unauthorized'"
    ):
        _run(tool, store, rows=3)
    assert len(tries) == 1


def test_other_exceptions_stay_the_tools_own(store) -> None:
    """An exception that is not an SDK's HTTP or connection error fails its row as raised, once, with the tool named."""
    tool, tries = _flaky([KeyError("company")])
    run, _ = _run(tool, store)
    assert run.result["play_status"].tolist() == ["failed"] and len(tries) == 1
    assert "KeyError" in run.result["play_error"].iloc[0]


# -- retry_on -----------------------------------------------------------------------------------


class Flaky(Exception):
    """An SDK's "try again" error, known only to the user."""


def test_retry_on_retries_the_listed_exceptions(store) -> None:
    """retry_on=(Flaky,) has the provider retry Flaky until the call goes through; without it, Flaky fails the row at once."""
    tool, tries = _flaky([Flaky("busy"), Flaky("still busy")], retry_on=(Flaky,))
    run, _ = _run(tool, store)
    assert run.result["play_status"].tolist() == ["ok"] and len(tries) == 3

    plain, tries = _flaky([Flaky("busy")], name="plain")
    run, _ = _run(plain, store)
    assert run.result["play_status"].tolist() == ["failed"] and len(tries) == 1
    assert "Flaky: busy" in run.result["play_error"].iloc[0]


def test_retry_on_gives_up_after_the_providers_retries(store) -> None:
    """A listed exception that keeps coming is retried `retries` times, then the row fails as ProviderUnavailable."""
    tool, tries = _flaky([Flaky("busy")] * 10, retry_on=Flaky, provider=pb.Provider("p", retries=2))
    run, _ = _run(tool, store)
    assert run.result["play_status"].tolist() == ["failed"] and len(tries) == 3
    assert (
        "ProviderUnavailable" in run.result["play_error"].iloc[0]
        and "Flaky: busy" in run.result["play_error"].iloc[0]
    )


def test_retry_on_covers_batch_tools(store) -> None:
    """A batch tool's own failure is classified too: a listed exception retries the whole batch."""
    tries: list[int] = []

    @pb.tool(batch_size=10, provider=pb.Provider("p"), retry_on=(Flaky,))
    async def lookup(items: list[dict[str, int]]) -> list[str]:
        tries.append(len(items))
        if len(tries) == 1:
            raise Flaky("busy")
        return [f"found{item['n']}" for item in items]

    @pb.play
    async def play(row, ctx):
        return {"v": await ctx.tool(lookup, n=row.n)}

    async def main() -> pd.DataFrame:
        return await pd.DataFrame({"n": range(3)}).play.amap(play, store=store, progress=False)

    out = run_virtual(main())
    assert out["play_status"].tolist() == ["ok"] * 3 and tries == [3, 3]


@pytest.mark.parametrize(
    ("retry_on", "match"),
    [
        ([Flaky], "retry_on must be an exception class or a tuple of them"),
        ("Flaky", "retry_on must be an exception class or a tuple of them"),
        ((Flaky, 3), "retry_on must be an exception class or a tuple of them"),
        ((KeyboardInterrupt,), "retry_on must be an exception class or a tuple of them"),
        ((pb.ToolError,), "playbook's own errors"),
    ],
)
def test_retry_on_is_validated(retry_on: Any, match: str) -> None:
    """retry_on= takes exception classes only; anything else is a PlayDefinitionError naming the tool."""
    with pytest.raises(pb.PlayDefinitionError, match=rf"tool 'lookup': .*{match}"):

        @pb.tool(retry_on=retry_on)
        async def lookup(n: int) -> int:
            return n


def test_retry_on_is_not_part_of_the_tools_identity(store) -> None:
    """Adding retry_on= keeps the tool's identity and fingerprint: the receipts already paid for still answer."""

    async def lookup(n: int) -> int:
        return n * 10

    plain = pb.tool(lookup)
    patient = pb.tool(lookup, retry_on=(Flaky, TimeoutError))
    patient_engine, plain_engine = engine_of(patient), engine_of(plain)
    assert (patient_engine.identity, patient.fingerprint) == (plain_engine.identity, plain.fingerprint)
    assert patient_engine.retry_on == (Flaky, TimeoutError) and plain_engine.retry_on == ()
    _map(pd.DataFrame({"n": [1, 2]}), plain, store)
    again = pd.DataFrame({"n": [1, 2]}).play.run(patient, store=store, progress=False)
    assert again.stats.calls_executed == 0 and again.result["lookup"].tolist() == [10, 20]


def test_importing_playbook_imports_no_sdk() -> None:
    """playbook recognises SDK errors without importing openai or requests itself."""
    code = "import sys, playbook; print(sorted(m for m in ('openai', 'requests', 'anthropic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
