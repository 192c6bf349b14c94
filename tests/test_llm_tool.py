"""LLM tools against the demo's OpenAI-compatible endpoint (a real HTTP server on loopback):
structured columns, cost in money from usage, a rerun that pays nothing, a prompt edit that pays
for one column, the re-ask, token limits configured and announced, a budget in dollars, and batch
jobs that survive the death of the process that submitted them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import pydantic
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.demo.fakedata import INDUSTRIES
from playbook.providers.provider import governor
from playbook.store import engine
from playbook.tools import engine_of

MODEL = "gpt-4o-mini"
PRICES = {MODEL: (0.15, 0.60)}
KEY = pb.secret("PLAYBOOK_TEST_LLM_KEY", default="demo-key")
LABELS = ("Software", "Retail", "Robotics", "Manufacturing", "Healthcare", "Finance")


class Profile(pydantic.BaseModel):
    industry: Literal["Software", "Retail", "Robotics", "Manufacturing", "Healthcare", "Finance"]
    summary: str
    employees: int | None = None


def _companies(n: int) -> pd.DataFrame:
    return pd.DataFrame({"company": [f"Company {i} {'Labs' if i % 2 else 'Stores'}" for i in range(n)]})


def _llm(demo: pb.demo.DemoServer, **options: Any) -> pb.Tool:
    options.setdefault("prices", PRICES)
    return pb.llm_tool(model=MODEL, base_url=demo.url + "/v1", secret=KEY, **options)


def _virtual(run: Any) -> pd.DataFrame:
    """A run of ``amap`` on virtual time (tests/vtime.py): the demo served in process keeps the
    loop's clock, so its batch windows, latency and token minutes pass without waiting."""
    return run_virtual(run)  # type: ignore[no-any-return]


def _cost(stats: dict[str, Any], prices: tuple[float, float] = PRICES[MODEL]) -> float:
    """What the demo's own counters say was used, priced."""
    usage = stats["chat"][MODEL]
    return (usage["prompt_tokens"] * prices[0] + usage["completion_tokens"] * prices[1]) / 1e6


def test_structured_answers_become_typed_columns_and_cost_exactly_their_usage(
    demo: pb.demo.DemoServer,
) -> None:
    """output=Model: one column per field, each value valid; cost_spent is the demo's usage x prices; a rerun pays nothing."""
    llm = _llm(demo, output=Profile, provider=pb.Provider("openai-a"))

    @pb.play(output=Profile)
    async def profile(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company} and summarise what it does.")

    frame = _companies(30)
    out = frame.play.map(profile, progress=False)
    assert list(out.columns) == ["company", "industry", "summary", "employees", "play_status", "play_error"]
    assert (out.play_status == "ok").all() and set(out.industry) <= set(LABELS)
    assert str(out.employees.dtype) == "Int64"
    stats = pb.last_run().stats  # type: ignore[union-attr]
    expected = _cost(demo.stats())
    assert stats.calls_executed == 30 and stats.cost_spent == round(expected, 9) and expected > 0

    again = frame.play.map(profile, progress=False)
    rerun = pb.last_run().stats  # type: ignore[union-attr]
    assert rerun.calls_executed == 0 and rerun.cost_spent == 0 and rerun.cost_saved == round(expected, 9)
    assert demo.stats()["chat"][MODEL]["requests"] == 30
    pd.testing.assert_frame_equal(again.drop(columns="play_status"), out.drop(columns="play_status"))


def test_changing_one_prompt_pays_for_that_column_only(demo: pb.demo.DemoServer) -> None:
    """Two LLM columns; the summary prompt edited: the summaries are paid again, the labels come from receipts."""
    llm = _llm(demo)
    frame = _companies(12)

    async def first(row: Any, ctx: pb.Context) -> dict[str, Any]:
        label = await ctx.tool(llm, prompt=f"Classify {row.company} into one of: {', '.join(LABELS)}")
        return {
            "industry": label,
            "summary": await ctx.tool(llm, prompt=f"Summarise what {row.company} does"),
        }

    async def second(row: Any, ctx: pb.Context) -> dict[str, Any]:
        label = await ctx.tool(llm, prompt=f"Classify {row.company} into one of: {', '.join(LABELS)}")
        return {
            "industry": label,
            "summary": await ctx.tool(llm, prompt=f"Summarise {row.company} for a sales team"),
        }

    before = frame.play.map(first, progress=False)
    after = frame.play.map(second, progress=False)
    stats = pb.last_run().stats  # type: ignore[union-attr]
    assert (stats.calls_executed, stats.calls_reused) == (12, 12)
    assert (after.industry == before.industry).all() and (after.summary != before.summary).all()
    assert demo.stats()["chat"][MODEL]["requests"] == 36


def test_an_invalid_json_answer_is_asked_again_once_and_paid_as_such(demo: pb.demo.DemoServer) -> None:
    """Every answer invalid: each row asks twice, both requests counted and priced, and fails naming the problem; a rerun pays nothing."""
    demo.reset(chat_invalid_json_rate=1.0)
    llm = _llm(demo, output=Profile)

    async def profile(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = _companies(5).play.map(profile, progress=False)
    assert (out.play_status == "failed").all()
    assert out.play_error[0].startswith("ToolError: llm tool 'llm': the answer is not valid JSON")
    assert "after a re-ask" in out.play_error[0] and "refresh=True" in out.play_error[0]
    stats = pb.last_run().stats  # type: ignore[union-attr]
    served = demo.stats()
    assert stats.calls_executed == 10 == served["chat"][MODEL]["requests"]
    assert stats.cost_spent == round(_cost(served), 9)

    again = _companies(5).play.map(profile, progress=False)
    assert pb.last_run().stats.calls_executed == 0  # type: ignore[union-attr]
    assert list(again.play_error) == list(out.play_error)


def test_some_invalid_answers_are_mended_by_the_re_ask(demo: pb.demo.DemoServer) -> None:
    """Half the answers invalid: rows whose re-ask is valid succeed; requests paid are exactly those the demo answered."""
    demo.reset(chat_invalid_json_rate=0.5)
    llm = _llm(demo, output=Profile)

    async def profile(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = _companies(40).play.map(profile, progress=False)
    stats = pb.last_run().stats  # type: ignore[union-attr]
    served = demo.stats()["chat"][MODEL]["requests"]
    assert 40 < stats.calls_executed == served < 80  # some were asked again, not all
    assert stats.ok > 20 and stats.ok + stats.failed == 40
    assert set(out.industry.dropna()) <= set(LABELS)


def test_a_token_limit_paces_calls_so_the_provider_refuses_none(demo: pb.demo.DemoServer) -> None:
    """Provider(tpm=) at the demo's own TPM: calls weighed by their tokens go evenly, with no 429."""
    demo.reset(chat_tpm=60_000)
    llm = _llm(demo, provider=pb.Provider("openai-tpm", tpm=60_000))

    async def summary(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(
            llm, prompt=f"Summarise this page: {row.company} makes things for people who need things " * 3
        )

    out = _virtual(_companies(60).play.amap(summary, progress=False, concurrency=16))
    served = demo.stats()
    assert (out.play_status == "ok").all()
    assert served["chat_rate_limited"] == {"requests": 0, "tokens": 0}
    used, limit = governor(llm.provider).tokens_per_minute()  # type: ignore[arg-type]
    usage = served["chat"][MODEL]
    assert used == usage["prompt_tokens"] + usage["completion_tokens"] and limit == 60_000


def test_limits_the_provider_announces_are_learned_and_its_429s_waited_out(demo: pb.demo.DemoServer) -> None:
    """No limits configured: the x-ratelimit headers teach the provider its TPM and RPM; 429s are retried after retry-after-ms; every row succeeds."""
    demo.reset(chat_tpm=30_000, chat_rpm=1_200)
    provider = pb.Provider("openai-learn")
    llm = _llm(demo, provider=provider)

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = _companies(40).play.map(label, progress=False)
    assert (out.play_status == "ok").all()
    assert governor(provider).limiter.token_rate == pytest.approx(30_000 / 60 * 0.98)
    assert provider.status().rate is not None and provider.status().rate <= 1_200 / 60 * 0.98 + 1e-9
    assert provider.status().tpm == pytest.approx(30_000)


def test_a_budget_in_dollars_is_passed_by_at_most_the_calls_in_flight(demo: pb.demo.DemoServer) -> None:
    """max_cost reserves each call's estimate and settles its real cost: spent <= max_cost + in flight x one call; the rest park."""
    llm = _llm(demo, prices={MODEL: (2_000.0, 8_000.0)})  # dear enough that 60 rows cost several dollars

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = _companies(60).play.map(label, progress=False, max_cost=1.0, concurrency=4)
    stats = pb.last_run().stats  # type: ignore[union-attr]
    most = max(engine_of(llm).spent({"usage": {"prompt_tokens": 40, "completion_tokens": 10}}).cost, 0.2)
    assert 0 < stats.ok < 60 and (out.play_status == "parked").sum() == 60 - stats.ok
    assert stats.cost_spent <= 1.0 + 4 * most
    assert stats.cost_spent == round(_cost(demo.stats(), (2_000.0, 8_000.0)), 9)


# Each dialect whose provider takes batch jobs: (model, the demo's base URL's path).
_BATCHED = {
    "openai": (MODEL, "/v1"),
    "anthropic": ("claude-sonnet-4-5", ""),
    "gemini": ("gemini-2.5-flash", ""),
}

_SUBMITTER = """
import sys, pandas as pd, playbook as pb
url, home, api, model, path = sys.argv[1:6]
llm = pb.llm_tool(api=api, model=model, base_url=url + path, secret=pb.secret("X", default="demo-key"), mode="batch")
async def label(row, ctx):
    return await ctx.tool(llm, prompt=f"Classify {row.company}")
frame = pd.DataFrame({"company": [f"Company {i}" for i in range(25)]})
frame.play.map(label, store=home, progress=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("api", list(_BATCHED))
def test_a_batch_job_survives_the_death_of_its_submitter_and_is_never_submitted_twice(
    demo_loopback: pb.demo.DemoServer, tmp_path: Path, api: str
) -> None:
    """mode="batch" in each dialect that has batches: a process killed (SIGKILL) while its batch runs; a new run waits for the same batch,
    lands every answer, creates none (on loopback: the other processes reach the provider by socket)."""
    demo = demo_loopback
    demo.reset(batch_seconds=4.0)
    script = tmp_path / "submit.py"
    script.write_text(textwrap.dedent(_SUBMITTER))
    home = tmp_path / "store"
    model, path = _BATCHED[api]
    proc = subprocess.Popen(
        [sys.executable, str(script), demo.url, str(home), api, model, path],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while demo.stats()["batches_created"] == 0:
            assert proc.poll() is None and time.monotonic() < deadline, "the batch was never created"
            time.sleep(0.05)
        time.sleep(0.5)  # the batch's id is written down right after it is created
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert demo.stats()["chat"] == {}  # not finished yet: nothing answered

    llm = pb.llm_tool(api=api, model=model, base_url=demo.url + path, secret=KEY, mode="batch")

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    frame = pd.DataFrame({"company": [f"Company {i}" for i in range(25)]})
    out = frame.play.map(label, store=str(home), progress=False)
    assert (out.play_status == "ok").all() and set(out.label) <= set(INDUSTRIES)
    assert demo.stats()["batches_created"] == 1
    assert pb.last_run().stats.calls_executed == 25  # type: ignore[union-attr]
    frame.play.map(label, store=str(home), progress=False)
    assert pb.last_run().stats.calls_executed == 0 and demo.stats()["batches_created"] == 1  # type: ignore[union-attr]


def test_batch_mode_gathers_every_rows_miss_into_one_job(demo: pb.demo.DemoServer) -> None:
    """Rows step aside while their calls gather: 100 rows at concurrency 4 make one batch, and structured outputs work there too."""
    demo.reset(batch_seconds=0.5)
    llm = _llm(demo, mode="batch", output=Profile)

    async def profile(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = _virtual(_companies(100).play.amap(profile, progress=False, concurrency=4))
    assert (out.play_status == "ok").all() and set(out.industry) <= set(LABELS)
    served = demo.stats()
    assert served["batches_created"] == 1 and served["chat_batch"][MODEL]["requests"] == 100
    # a batch job's answers cost half the prices given (a batch API's discount)
    assert pb.last_run().stats.cost_spent == round(_cost(served) / 2, 9)  # type: ignore[union-attr]


def test_a_batch_whose_id_was_never_written_down_is_found_by_its_file(
    demo: pb.demo.DemoServer, tmp_path: Path
) -> None:
    """Markers name the uploaded file but no batch (the submitter died in between): the run finds the batch made over that file."""
    import asyncio

    from playbook.addresses import job_address
    from playbook.store.records import record
    from playbook.tools.llm import LlmEngine
    from playbook.tools.llm.batch import OpenAiBatches, custom_id
    from playbook.tools.protocol import NO_INPUT
    from playbook.tools.transport import default_client

    demo.reset(batch_seconds=0.3)
    llm = _llm(demo, mode="batch")
    asked = engine_of(llm)
    assert isinstance(asked, LlmEngine)
    frame = _companies(6)
    calls = [asked.bind(NO_INPUT, {"prompt": f"Classify {c}"}) for c in frame.company]
    store = pb.ReceiptStore(tmp_path / "store")

    async def died_after_creating() -> None:
        api = OpenAiBatches(asked)
        members = [(custom_id(asked.address(v)), asked.body(v["messages"])) for v in calls]
        async with default_client() as client:  # the run's client: it reaches the demo served in process
            file_id = await api.prepare(client, members)
            await api.create(client, file_id, members)
        for values in calls:
            await engine(store).commit(
                record(
                    job_address(asked.address(values)),
                    tool=llm.name,
                    stored={"file": file_id},
                    tagged=False,
                    at=time.time(),
                )
            )

    asyncio.run(died_after_creating())

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = frame.play.map(label, store=store, progress=False)
    assert (out.play_status == "ok").all()
    assert demo.stats()["batches_created"] == 1


def test_an_llm_tool_mapped_over_a_frame_reads_its_prompt_column(demo: pb.demo.DemoServer) -> None:
    """df.play.map(llm): the 'prompt' column is each call's prompt; the answer is a column named after the tool."""
    llm = _llm(demo)
    frame = pd.DataFrame(
        {"prompt": ["Classify Acme Robotics", "Summarise this page: a shop that sells bread and cake"]}
    )
    out = frame.play.map(llm, progress=False)
    assert list(out.columns) == ["prompt", "llm", "play_status", "play_error"]
    assert (out.play_status == "ok").all() and out.llm[1].startswith("Summary:")


def test_a_slow_upload_does_not_make_woken_rows_submit_again(demo: pb.demo.DemoServer) -> None:
    """Rows that wake while their submission is still uploading wait for it: one batch, each request billed once."""
    demo.reset(batch_seconds=0.5, latency=0.8)
    llm = _llm(demo, mode="batch")

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = _virtual(_companies(30).play.amap(label, progress=False))
    served = demo.stats()
    assert (out.play_status == "ok").all()
    assert served["batches_created"] == 1 and served["chat_batch"][MODEL]["requests"] == 30
    # a batch job's answers cost half the prices given (a batch API's discount)
    assert pb.last_run().stats.cost_spent == round(_cost(served) / 2, 9)  # type: ignore[union-attr]


@pytest.mark.slow
def test_two_processes_running_one_batch_play_on_one_store_submit_it_once(
    demo_loopback: pb.demo.DemoServer, tmp_path: Path
) -> None:
    """A second process finds the calls leased by the first while it submits: one batch between them, 25 requests billed (on
    loopback: the other processes reach the provider by socket)."""
    demo = demo_loopback
    demo.reset(batch_seconds=2.0, latency=1.0)  # slow enough that both gather at once
    script = tmp_path / "submit.py"
    script.write_text(textwrap.dedent(_SUBMITTER))
    home = tmp_path / "store"
    other = subprocess.Popen([sys.executable, str(script), demo.url, str(home), "openai", MODEL, "/v1"])
    try:
        llm = pb.llm_tool(model=MODEL, base_url=demo.url + "/v1", secret=KEY, mode="batch")

        async def label(row: Any, ctx: pb.Context) -> Any:
            return await ctx.tool(llm, prompt=f"Classify {row.company}")

        frame = pd.DataFrame({"company": [f"Company {i}" for i in range(25)]})
        out = frame.play.map(label, store=str(home), progress=False)
        assert other.wait(timeout=60) == 0
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    served = demo.stats()
    assert (out.play_status == "ok").all()
    assert served["batches_created"] == 1 and served["chat_batch"][MODEL]["requests"] == 25


def test_a_request_the_batch_failed_fails_its_row_and_is_submitted_again_next_run(
    demo: pb.demo.DemoServer,
) -> None:
    """A request the provider refuses (an image the demo cannot read, no text) is refused inside the batch (its error file): that row fails with the provider's words; a rerun resubmits only it."""
    demo.reset(batch_seconds=0.3)
    llm = _llm(demo, mode="batch")
    image = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}
    ]

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=row.prompt) if row.prompt else await ctx.tool(llm, messages=image)

    frame = pd.DataFrame({"prompt": ["Classify Acme Robotics", "", "Classify Globex"]})
    out = _virtual(frame.play.amap(label, progress=False))
    assert list(out.play_status) == ["ok", "failed", "ok"]
    assert "HTTP 400" in out.play_error[1] and "user message with text" in out.play_error[1]
    assert "the next run submits it again" in out.play_error[1]
    again = _virtual(frame.play.amap(label, progress=False))
    assert list(again.play_status) == ["reused", "failed", "reused"]
    served = demo.stats()
    assert served["batches_created"] == 2 and served["chat_batch"][MODEL]["requests"] == 2


def test_a_re_ask_that_fails_is_retried_alone_without_paying_for_the_first_answer_again(
    demo: pb.demo.DemoServer,
) -> None:
    """Every other request a 503: the re-ask fails and is retried; the first answer, already paid, is not asked for again."""
    demo.reset(chat_invalid_json_rate=1.0, fault_every=2)
    llm = _llm(demo, output=Profile, provider=pb.Provider("openai-flaky"))

    async def profile(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    out = _companies(1).play.map(profile, progress=False)
    assert "after a re-ask" in out.play_error[0]
    served = demo.stats()
    assert served["chat"][MODEL]["requests"] == 2 and served["by_status"] == {"200": 2, "503": 1}
    assert pb.last_run().stats.calls_executed == 2  # type: ignore[union-attr]


def test_an_llm_tool_without_a_provider_is_paced_and_retried_by_its_default_one(
    demo: pb.demo.DemoServer,
) -> None:
    """No provider=: 429s (a request limit the tool was never told) are waited out and retried, so every row is
    answered; the tools of one key share a default provider named after the host, another key is another account,
    and the receipts are those of a tool without a provider."""
    demo.reset(chat_rpm=60)
    llm = _llm(demo)

    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify Company {row.n}")

    out = _virtual(pd.DataFrame({"n": range(30)}).play.amap(label, progress=False))
    served = demo.stats()
    assert (out.play_status == "ok").all() and served["by_status"].get("429", 0) > 0
    engine = engine_of(llm)
    assert engine.provider is not None and (engine.provider.name, engine.provider.account) == (
        "demo.local",
        f"demo.local:{KEY.env_var}",
    )
    shared = governor(engine.provider)
    assert governor(engine_of(_llm(demo, name="other")).provider) is shared  # type: ignore[arg-type]
    other_key = pb.llm_tool(model=MODEL, base_url=demo.url + "/v1", secret=pb.secret("ANOTHER_KEY"))
    assert governor(engine_of(other_key).provider) is not shared  # type: ignore[arg-type]
    assert engine.account == "default" and "provider=" not in repr(llm)
    assert engine_of(pb.llm_tool(model=MODEL, api="anthropic")).provider.name == "anthropic"  # type: ignore[union-attr]
