"""B7's rows per dialect: each against that dialect's binding limit on the demo, beside the
official SDK with its own retries under ``asyncio.gather`` and a semaphore (the baseline a careful
engineer writes), and curator's Anthropic backend on the same server and limits.

     row                  the demo's limits                   bounds (ours)
     Anthropic            input and output tokens a minute    >= 0.9 of the binding limit; 429s
                          apart (buckets holding a minute's   <= 5%; 0 rows failed; cost_spent =
                          worth; max_tokens charged on        the demo's usage x Anthropic's list
                          arrival), 529 bursts                price +- 1%
     Gemini, a minute     requests a minute, counted in       429s <= one per call in flight per
                          windows of a minute; the wait only  window; every row ok once the window
                          in the body (RetryInfo)             opens
     Gemini, a day        requests a day, spent               the rest park within seconds naming
                                                              the daily quota; 429s <= calls in
                                                              flight
     Azure                tokens a minute, a sixth per 10 s   >= 0.75 of the token rate (prompt +
                          window, prompt + max_tokens         max_tokens, as Azure counts); 429s
                          charged on arrival                  <= 10%
     a local server       4 decode slots and a queue of 4,    time <= 1.4 x its capacity; 503s
                          503 past that; concurrency 64       <= 10%
     curator              Anthropic's row's server and        ahead of curator, as a share of the
                          limits                              binding limit

Each row's ratio is ours over its baseline (higher is better, or for refusals lower); the bounds
are judged in the notes under it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import anthropic
import httpx
import openai
import pandas as pd
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

import playbook as pb

from . import b7_curator
from .b7_measure import (
    KEY,
    Budget,
    Contender,
    Outcome,
    Ran,
    gathered,
    input_tokens,
    measured,
    median,
    ours,
    output_tokens,
)
from .harness import Result

LATENCY = 1.0  # seconds per answer, every dialect but the local server
RETRIES = 100  # the SDKs' own retries, for the baselines: enough that no row gives up
SECRET = pb.secret("DEMO_API_KEY", default=KEY)

# -- Anthropic ----------------------------------------------------------------------------------

ANTHROPIC_MODEL = "claude-haiku-4-5"
LIST_PRICE = (1.00, 5.00)  # dollars per 1M input and output tokens, Anthropic's pricing page for Haiku 4.5
ITPM, OTPM = 20_000, 3_000  # ~260 input and ~37 output tokens a call: ~77 and ~81 calls a minute
ANTHROPIC_MAX_TOKENS = 256  # charged against the output budget on arrival, given back at the answer
ANTHROPIC_ROWS = 115  # a minute's worth goes at once (the buckets start full), then ~30 s of the limit
ANTHROPIC_CONCURRENCY = 16
BURST, PERIOD = 2.0, 15.0  # a burst of 529s for the first 2 s of every 15 s on the demo's clock
ANTHROPIC = {
    "latency": LATENCY,
    "anthropic_itpm": ITPM,
    "anthropic_otpm": OTPM,
    "overload_seconds": BURST,
    "overload_period": PERIOD,
    "overload_apis": ["anthropic"],
}
ANTHROPIC_BUDGETS = (
    Budget("input tokens", ITPM, ITPM, input_tokens),
    Budget("output tokens", OTPM, OTPM, output_tokens),
)
ANTHROPIC_GOODPUT, ANTHROPIC_REFUSED, PRICE_TOLERANCE = 0.9, 0.05, 0.01
CURATOR_PARAMS = {  # curator's own configuration for Anthropic, as its docs and example give it
    "max_input_tokens_per_minute": ITPM,
    "max_output_tokens_per_minute": OTPM,
    "max_retries": 20,
}

# -- Gemini -------------------------------------------------------------------------------------

GEMINI_MODEL = "gemini-2.5-flash"
GEMINI_RPM = 20  # counted in windows of a minute
GEMINI_MINUTE_ROWS = 40  # two windows' worth
GEMINI_RPD = 12
GEMINI_DAY_ROWS = 28  # 16 past the day's quota
GEMINI_CONCURRENCY = 8
WINDOW_LEFT = 30.0  # seconds of its first minute window each contender of the minute row starts with
GEMINI_MINUTE = {"latency": LATENCY, "gemini_rpm": GEMINI_RPM}
GEMINI_DAY = {"latency": LATENCY, "gemini_rpd": GEMINI_RPD}
GEMINI_ATTEMPTS = 10  # the SDK's retries for the minute row: its backoff (1, 2, 4 ... 60 s) outlasts a window
PARKED_WITHIN = 10.0  # seconds for the day row's rows past the quota to park

# -- Azure --------------------------------------------------------------------------------------

AZURE_DEPLOYMENT = "gpt-4o-mini"
AZURE_VERSION = "2024-10-21"
AZURE_TPM = 24_000  # a sixth per 10 s window: 4,000
AZURE_MAX_TOKENS = 100  # charged on arrival with the prompt: ~360 a call, ~11 a window
AZURE_ROWS = 48
AZURE_CONCURRENCY = 16
AZURE = {"latency": LATENCY, "azure_tpm": AZURE_TPM}
AZURE_GOODPUT, AZURE_REFUSED = 0.75, 0.10

# -- a local server -----------------------------------------------------------------------------

LOCAL_MODEL = "llama3.2"
SLOTS, QUEUE, SERVICE = 4, 4, 0.5  # decode slots, queue places, seconds an answer takes in a slot
LOCAL_ROWS = 64
LOCAL_CONCURRENCY = 64  # configured far above what the server takes
LOCAL = {"local_slots": SLOTS, "local_queue": QUEUE, "local_service_seconds": SERVICE}
LOCAL_TIME, LOCAL_REFUSED = 1.4, 0.10


def _pair(
    url: str,
    api: str,
    settings: dict[str, Any],
    rows: pd.DataFrame,
    mine: Contender,
    base: Contender,
    repeats: int,
) -> tuple[list[Outcome], list[Outcome]]:
    """Baseline and ours alternately ``repeats`` times, so a slow spell of the machine hits both."""
    theirs, ours_ = [], []
    for _ in range(repeats):
        theirs.append(measured(url, api, settings, rows, base))
        ours_.append(measured(url, api, settings, rows, mine))
    return ours_, theirs


def _rate(outcome: Outcome, budgets: tuple[Budget, ...]) -> float:
    """The run's rate on its binding budget, per minute."""
    budget, share = outcome.binding(budgets)
    return share * budget.per_minute


def _figures(label: str, outcome: Outcome, budgets: tuple[Budget, ...]) -> str:
    budget, share = outcome.binding(budgets)
    return (
        f"{label}: {share:.2f} of {budget.per_minute:,.0f} {budget.name}/min, 429s {outcome.share():.1%} of "
        f"{outcome.requests} requests, {outcome.rows - outcome.ok} rows not ok, {outcome.seconds:.1f}s"
    )


def _why(outcome: Outcome) -> list[tuple[str, bool | None]]:
    errors = outcome.ran.errors
    return [(f"  first of {len(errors)} not ok: {errors[0][:240]}", None)] if errors else []


# -- Anthropic ----------------------------------------------------------------------------------


def _anthropic_ours() -> Contender:
    def tool(url: str) -> pb.LlmTool:
        provider = pb.Provider("b7-anthropic", itpm=ITPM, otpm=OTPM)
        return pb.llm_tool(
            model=ANTHROPIC_MODEL,
            api="anthropic",
            base_url=url,
            secret=SECRET,
            provider=provider,
            max_tokens=ANTHROPIC_MAX_TOKENS,
        )

    return ours(tool, ANTHROPIC_CONCURRENCY)


async def _anthropic_call(client: anthropic.AsyncAnthropic, prompt: str) -> bool:
    answer = await client.messages.create(
        model=ANTHROPIC_MODEL, max_tokens=ANTHROPIC_MAX_TOKENS, messages=[{"role": "user", "content": prompt}]
    )
    return bool(answer.content)


ANTHROPIC_BASELINE = f"anthropic SDK retries + gather/Semaphore({ANTHROPIC_CONCURRENCY})"


def _after_burst() -> None:
    """Wait for the end of the demo's next burst of 529s (on its clock, ``time.monotonic``): every
    contender starts at the same point of the bursts' period."""
    now = time.monotonic()
    time.sleep(math.ceil((now - BURST) / PERIOD) * PERIOD + BURST - now + 0.05)


def _anthropic_left(url: str) -> dict[str, float]:
    """What the input and output budgets hold now, as the demo's ``anthropic-ratelimit-*-remaining``
    headers say on a request it refuses before charging it (no ``max_tokens``: a 400 at once)."""
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    asked = {"model": ANTHROPIC_MODEL, "messages": [{"role": "user", "content": "left?"}]}
    told = httpx.post(url + "/v1/messages", headers=headers, json=asked, timeout=5).headers
    return {
        budget: float(told[f"anthropic-ratelimit-{name}-remaining"])
        for budget, name in (("input tokens", "input-tokens"), ("output tokens", "output-tokens"))
        if f"anthropic-ratelimit-{name}-remaining" in told
    }


def anthropic_rows(url: str, rows: pd.DataFrame, repeats: int) -> list[Result]:
    """The Anthropic row and curator's beside it, on the same server and limits."""
    base = gathered(
        lambda u: anthropic.AsyncAnthropic(base_url=u, api_key=KEY, max_retries=RETRIES),
        _anthropic_call,
        ANTHROPIC_CONCURRENCY,
        (anthropic.APIError,),
    )
    mine, theirs, curated = [], [], []
    for _ in range(repeats):
        for contender, into in ((base, theirs), (_anthropic_ours(), mine), (_curator, curated)):
            _after_burst()
            into.append(measured(url, "anthropic", ANTHROPIC, rows, contender, _anthropic_left))
    key = lambda o: _rate(o, ANTHROPIC_BUDGETS)  # noqa: E731
    ours_, base_, cur = median(mine, key), median(theirs, key), median(curated, key)
    return [_anthropic_row(ours_, base_), _curator_row(ours_, cur)]


def _anthropic_row(mine: Outcome, base: Outcome) -> Result:
    budget, share = mine.binding(ANTHROPIC_BUDGETS)
    name = f"B7 Anthropic {ITPM // 1000}k in/{OTPM // 1000}k out"
    # The SDK reaches the limit by sending until refused (four in ten of its requests are 429s):
    # ours keeps to it, and the ratio must stay within the bound's share of the SDK's rate.
    result = Result(
        name,
        "/m",
        _rate(mine, ANTHROPIC_BUDGETS),
        _rate(base, ANTHROPIC_BUDGETS),
        ANTHROPIC_BASELINE,
        ANTHROPIC_GOODPUT,
    )
    counters = mine.counters
    billed = (counters["input_tokens"] * LIST_PRICE[0] + counters["output_tokens"] * LIST_PRICE[1]) / 1e6
    cost = mine.ran.cost
    within = cost is not None and billed > 0 and abs(cost - billed) <= PRICE_TOLERANCE * billed
    result.notes = [
        (
            f"binding: {budget.name}, {budget.per_minute:,.0f}/min; {share:.2f} of it >= {ANTHROPIC_GOODPUT:.2f} "
            f"({counters['input_tokens']:,} in, {counters['output_tokens']:,} out tokens in {mine.seconds:.1f}s)",
            share >= ANTHROPIC_GOODPUT,
        ),
        (
            f"429s {mine.share():.1%} of {mine.requests} requests <= {ANTHROPIC_REFUSED:.0%}; "
            f"529s {mine.refused(529)}; {mine.rows - mine.ok} rows not ok",
            mine.share() <= ANTHROPIC_REFUSED and mine.ok == mine.rows,
        ),
        *_why(mine),
        (
            f"cost_spent ${cost if cost is not None else float('nan'):.6f} = the demo's usage x list price "
            f"${billed:.6f} +- {PRICE_TOLERANCE:.0%}",
            within,
        ),
        (
            f"429s: ours {mine.share():.1%}, the SDK's {base.share():.1%}: ours fewer",
            mine.share() < base.share(),
        ),
        (_figures("baseline", base, ANTHROPIC_BUDGETS) + f", 529s {base.refused(529)}", None),
        *_why(base),
    ]
    return result


def _curator(url: str, rows: pd.DataFrame) -> Ran:
    start = time.perf_counter()
    try:
        done = b7_curator.run(
            url, ANTHROPIC_MODEL, list(rows["prompt"]), ANTHROPIC_MAX_TOKENS, CURATOR_PARAMS
        )
    except RuntimeError as exc:  # it did not finish: the row says why
        return Ran(0, time.perf_counter() - start, errors=[str(exc).replace("\n", " | ")[-400:]])
    return Ran(
        done.ok,
        done.seconds,
        extra={"heard_input_tpm": done.heard_input_tpm, "heard_output_tpm": done.heard_output_tpm},
    )


def _curator_row(mine: Outcome, theirs: Outcome) -> Result:
    ours_rate, their_rate = _rate(mine, ANTHROPIC_BUDGETS), _rate(theirs, ANTHROPIC_BUDGETS)
    budget, share = mine.binding(ANTHROPIC_BUDGETS)
    their_budget, their_share = theirs.binding(ANTHROPIC_BUDGETS)
    name = "B7 Anthropic vs curator"
    result = Result(
        name, "/m", ours_rate, their_rate, f"curator {b7_curator.version()}, anthropic backend", 1.0
    )
    heard_in, heard_out = theirs.ran.extra.get("heard_input_tpm"), theirs.ran.extra.get("heard_output_tpm")
    result.notes = [
        (
            f"ours {share:.2f} of {budget.name} {budget.per_minute:,.0f}/min; curator {their_share:.2f} of "
            f"{their_budget.name} {their_budget.per_minute:,.0f}/min: ours ahead",
            share > their_share,
        ),
        (
            f"curator: 429s {theirs.share():.1%} of {theirs.requests} requests, 529s {theirs.refused(529)}, "
            f"{theirs.rows - theirs.ok} rows not ok, {theirs.seconds:.1f}s",
            None,
        ),
        *_why(theirs),
        (
            f"curator read its input-token limit as {heard_in} and its output-token limit as {heard_out} from "
            f"the headers (the server announces {ITPM:,} input, {OTPM:,} output); given both, it paces by those",
            None,
        ),
    ]
    return result


# -- Gemini -------------------------------------------------------------------------------------


def _gemini_ours() -> Contender:
    def tool(url: str) -> pb.LlmTool:
        return pb.llm_tool(
            model=GEMINI_MODEL, api="gemini", base_url=url, secret=SECRET, provider=pb.Provider("b7-gemini")
        )

    return ours(tool, GEMINI_CONCURRENCY)


def _gemini_base(attempts: int | None) -> Contender:
    def client(url: str) -> genai.Client:
        retry = genai_types.HttpRetryOptions(attempts=attempts)
        return genai.Client(
            api_key=KEY, http_options=genai_types.HttpOptions(base_url=url, retry_options=retry)
        )

    async def call(client: genai.Client, prompt: str) -> bool:
        answer = await client.aio.models.generate_content(model=GEMINI_MODEL, contents=prompt)
        return bool(answer.text)

    return gathered(client, call, GEMINI_CONCURRENCY, (genai_errors.APIError,))


def _window_phase() -> None:
    """Wait until ``WINDOW_LEFT`` seconds before a minute window ends on the demo's clock
    (``time.monotonic``): every contender of the minute row meets its windows at the same point."""
    now = time.monotonic()
    time.sleep((60.0 - WINDOW_LEFT - now) % 60.0)


def gemini_rows(url: str, rows_minute: pd.DataFrame, rows_day: pd.DataFrame, repeats: int) -> list[Result]:
    minute: tuple[list[Outcome], list[Outcome]] = ([], [])
    for _ in range(repeats):
        for contender, into in ((_gemini_base(GEMINI_ATTEMPTS), minute[1]), (_gemini_ours(), minute[0])):
            _window_phase()
            into.append(measured(url, "gemini", GEMINI_MINUTE, rows_minute, contender))
    day = _pair(url, "gemini", GEMINI_DAY, rows_day, _gemini_ours(), _gemini_base(None), repeats)
    refused = lambda o: float(o.refused())  # noqa: E731
    return [
        _gemini_minute_row(median(minute[0], refused), median(minute[1], refused)),
        _gemini_day_row(median(day[0], refused), median(day[1], refused)),
    ]


def _windows(outcome: Outcome) -> tuple[int, float]:
    """Gemini's minute windows (aligned on the demo's clock, which is ``time.monotonic``) that
    closed during the run, and the seconds from the last one's opening to the run's end."""
    first, last = math.floor(outcome.ran.started / 60.0), math.floor(outcome.ran.ended / 60.0)
    return last - first, outcome.ran.ended - 60.0 * last


def _gemini_minute_row(mine: Outcome, base: Outcome) -> Result:
    closed, after = _windows(mine)
    most = GEMINI_CONCURRENCY * closed
    # Once the last window opens, its rows (a window's worth at most) take a latency per round of
    # calls in flight.
    rounds = math.ceil(min(mine.rows, GEMINI_RPM) / GEMINI_CONCURRENCY)
    slack = rounds * LATENCY + 2.0
    name = f"B7 Gemini, {GEMINI_RPM} req/min windows"
    result = Result(
        name,
        "",
        mine.refused(),
        base.refused(),
        f"google-genai retries ({GEMINI_ATTEMPTS} attempts) + gather",
        1.0,
        at_most=True,
    )
    base_closed, base_after = _windows(base)
    result.notes = [
        (
            f"429s {mine.refused()} of {mine.requests} requests <= {GEMINI_CONCURRENCY} in flight x {closed} "
            f"window(s) closed on the run = {most}",
            mine.refused() <= most,
        ),
        (
            f"{mine.ok} of {mine.rows} rows ok in {mine.seconds:.1f}s, the last {after:.1f}s after the last "
            f"window opened <= {slack:.0f}s ({rounds} rounds of {LATENCY:g}s + 2s)",
            mine.ok == mine.rows and (closed == 0 or after <= slack),
        ),
        *_why(mine),
        (
            f"baseline: 429s {base.refused()} of {base.requests} requests, {base.rows - base.ok} rows not ok, "
            f"{base.seconds:.1f}s, the last {base_after:.1f}s after the last window opened ({base_closed} closed)",
            None,
        ),
        *_why(base),
    ]
    return result


def _gemini_day_row(mine: Outcome, base: Outcome) -> Result:
    parked = [e for e in mine.ran.errors if "perday" in e.lower().replace(" ", "") or "daily" in e.lower()]
    over = mine.rows - GEMINI_RPD
    name = f"B7 Gemini, {GEMINI_RPD} req/day spent"
    result = Result(
        name, "", mine.refused(), base.refused(), "google-genai default retries + gather", 1.0, at_most=True
    )
    result.notes = [
        (
            f"{mine.ran.statuses.get('parked', 0)} of the {over} rows past the quota parked, naming the daily "
            f"quota ({len(parked)}), the run over in {mine.seconds:.1f}s <= {PARKED_WITHIN:.0f}s",
            mine.ran.statuses.get("parked", 0) == over
            and len(parked) == over
            and mine.seconds <= PARKED_WITHIN,
        ),
        *([(f"  {parked[0][:240]}", None)] if parked else _why(mine)),
        (
            f"429s {mine.refused()} of {mine.requests} requests <= {GEMINI_CONCURRENCY} in flight; "
            f"{mine.ok} rows ok of the quota's {GEMINI_RPD}",
            mine.refused() <= GEMINI_CONCURRENCY and mine.ok == GEMINI_RPD,
        ),
        (
            f"baseline: 429s {base.refused()} of {base.requests} requests, {base.rows - base.ok} rows not ok, "
            f"{base.seconds:.1f}s",
            None,
        ),
        *_why(base),
    ]
    return result


# -- Azure --------------------------------------------------------------------------------------


def _charged(counters: dict[str, Any]) -> float:
    """What Azure's token limit counts: each answered call's prompt and its max_tokens."""
    return float(counters["input_tokens"] + counters["ok"] * AZURE_MAX_TOKENS)


AZURE_BUDGETS = (Budget("tokens (prompt + max_tokens)", AZURE_TPM, AZURE_TPM / 6, _charged),)


def _azure_ours() -> Contender:
    def tool(url: str) -> pb.LlmTool:
        return pb.llm_tool(
            model=AZURE_DEPLOYMENT,
            api="azure",
            api_version=AZURE_VERSION,
            base_url=url,
            secret=SECRET,
            provider=pb.Provider("b7-azure", tpm=AZURE_TPM),
            max_tokens=AZURE_MAX_TOKENS,
        )

    return ours(tool, AZURE_CONCURRENCY)


async def _azure_call(client: openai.AsyncAzureOpenAI, prompt: str) -> bool:
    answer = await client.chat.completions.create(
        model=AZURE_DEPLOYMENT, messages=[{"role": "user", "content": prompt}], max_tokens=AZURE_MAX_TOKENS
    )
    return answer.choices[0].message.content is not None


def azure_rows(url: str, rows: pd.DataFrame, repeats: int) -> list[Result]:
    base = gathered(
        lambda u: openai.AsyncAzureOpenAI(
            azure_endpoint=u, api_key=KEY, api_version=AZURE_VERSION, max_retries=RETRIES
        ),
        _azure_call,
        AZURE_CONCURRENCY,
        (openai.APIError,),
    )
    mine, theirs = _pair(url, "azure", AZURE, rows, _azure_ours(), base, repeats)
    key = lambda o: _rate(o, AZURE_BUDGETS)  # noqa: E731
    mine_, base_ = median(mine, key), median(theirs, key)
    _, share = mine_.binding(AZURE_BUDGETS)
    name = f"B7 Azure {AZURE_TPM // 1000}k tok/min, 10s"
    result = Result(
        name,
        "/m",
        key(mine_),
        key(base_),
        f"openai SDK (Azure) retries + gather/Semaphore({AZURE_CONCURRENCY})",
        # The SDK reaches the rate by sending into the windows until they refuse (half its requests
        # are 429s): ours keeps to the windows, and the ratio must stay within the same share of it.
        AZURE_GOODPUT,
    )
    result.notes = [
        (
            f"{share:.2f} of {AZURE_TPM:,} tokens/min (prompt + max_tokens, {_charged(mine_.counters):,.0f} "
            f"charged in {mine_.seconds:.1f}s) >= {AZURE_GOODPUT:.2f}",
            share >= AZURE_GOODPUT,
        ),
        (
            f"429s {mine_.share():.1%} of {mine_.requests} requests <= {AZURE_REFUSED:.0%}; "
            f"{mine_.rows - mine_.ok} rows not ok",
            mine_.share() <= AZURE_REFUSED and mine_.ok == mine_.rows,
        ),
        *_why(mine_),
        (
            f"429s: ours {mine_.share():.1%}, the SDK's {base_.share():.1%}: ours fewer",
            mine_.share() < base_.share(),
        ),
        (_figures("baseline", base_, AZURE_BUDGETS), None),
        *_why(base_),
    ]
    return [result]


# -- a local server -----------------------------------------------------------------------------


def _local_ours() -> Contender:
    def tool(url: str) -> pb.LlmTool:
        return pb.llm_tool(
            model=LOCAL_MODEL, base_url=url + "/v1", secret=None, provider=pb.Provider("b7-local")
        )

    return ours(tool, LOCAL_CONCURRENCY)


async def _local_call(client: openai.AsyncOpenAI, prompt: str) -> bool:
    answer = await client.chat.completions.create(
        model=LOCAL_MODEL, messages=[{"role": "user", "content": prompt}]
    )
    return answer.choices[0].message.content is not None


LOCAL_API = "local"  # the demo's counters' name for its chat endpoint in local server mode


def local_rows(url: str, rows: pd.DataFrame, repeats: int) -> list[Result]:
    base = gathered(
        lambda u: openai.AsyncOpenAI(base_url=u + "/v1", api_key="none", max_retries=RETRIES),
        _local_call,
        LOCAL_CONCURRENCY,
        (openai.APIError,),
    )
    mine, theirs = _pair(url, LOCAL_API, LOCAL, rows, _local_ours(), base, repeats)
    per_minute = lambda o: o.ok * 60.0 / o.seconds if o.seconds else 0.0  # noqa: E731
    mine_, base_ = median(mine, per_minute), median(theirs, per_minute)
    capacity = math.ceil(mine_.rows / SLOTS) * SERVICE
    name = f"B7 local, {SLOTS} slots + queue {QUEUE}"
    result = Result(
        name,
        "/m",
        per_minute(mine_),
        per_minute(base_),
        f"openai SDK retries + gather/Semaphore({LOCAL_CONCURRENCY})",
        1.0,
    )
    result.notes = [
        (
            f"{mine_.seconds:.1f}s for {mine_.rows} rows = {mine_.seconds / capacity:.2f} x its capacity "
            f"({capacity:.1f}s: {SLOTS} slots x {SERVICE:g}s an answer) <= {LOCAL_TIME}",
            mine_.seconds <= LOCAL_TIME * capacity,
        ),
        (
            f"503s {mine_.share(503):.1%} of {mine_.requests} requests <= {LOCAL_REFUSED:.0%}; "
            f"{mine_.rows - mine_.ok} rows not ok",
            mine_.share(503) <= LOCAL_REFUSED and mine_.ok == mine_.rows,
        ),
        *_why(mine_),
        (
            f"baseline: {base_.seconds:.1f}s = {base_.seconds / capacity:.2f} x capacity, 503s {base_.share(503):.1%} "
            f"of {base_.requests} requests, {base_.rows - base_.ok} rows not ok",
            None,
        ),
        *_why(base_),
    ]
    return [result]
