"""Batch jobs beyond OpenAI: ``mode="batch"`` with Anthropic's Message Batches and Gemini's batch
mode, against the demo's own batch endpoints (served in process, on virtual time): every row
answered, receipts the online call's, a rerun sending nothing, a run restarted mid-batch finding
its batch, a lost batch id found, failed and expired requests failing only their rows, and the
estimate's batch-versus-online cost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import pydantic
import pytest
from vtime import run_virtual

import playbook as pb
from playbook.addresses import job_address
from playbook.store import engine
from playbook.store.records import record
from playbook.tools import engine_of
from playbook.tools.llm import LlmEngine
from playbook.tools.protocol import NO_INPUT
from playbook.tools.transport import default_client

APIS = ("anthropic", "gemini")
MODELS = {"anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-flash"}
LIST_PRICE = (3.0, 15.0)  # per 1M input, output tokens
KEY = pb.secret("PLAYBOOK_TEST_LLM_KEY", default="demo-key")
LABELS = ("Software", "Retail", "Robotics", "Manufacturing", "Healthcare", "Finance")


class Profile(pydantic.BaseModel):
    industry: Literal["Software", "Retail", "Robotics", "Manufacturing", "Healthcare", "Finance"]
    summary: str


def _llm(demo: pb.demo.DemoServer, api: str, **options: Any) -> pb.Tool:
    model = MODELS[api]
    return pb.llm_tool(
        api=api, model=model, base_url=demo.url, secret=KEY, prices={model: LIST_PRICE}, **options
    )


def _companies(n: int) -> pd.DataFrame:
    return pd.DataFrame({"company": [f"Company {i} {'Labs' if i % 2 else 'Stores'}" for i in range(n)]})


def _profiler(demo: pb.demo.DemoServer, api: str, **options: Any) -> Any:
    llm = _llm(demo, api, output=Profile, **options)

    @pb.play(output=Profile)
    async def profile(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company} and summarise what it does.")

    return profile


def _labeller(llm: pb.Tool) -> Any:
    # An empty prompt is refused in its row before it is sent; an empty user message is sent, and
    # the provider refuses it inside the batch.
    async def label(row: Any, ctx: pb.Context) -> Any:
        if not row.prompt:
            return await ctx.tool(llm, messages=[{"role": "user", "content": ""}])
        return await ctx.tool(llm, prompt=row.prompt)

    return label


def _billed(stats: dict[str, Any], api: str, share: float = 1.0) -> float:
    """What the demo's counters say its batches answered, priced at ``share`` of the list price."""
    usage = stats["chat_batch"][MODELS[api]]
    return share * (usage["prompt_tokens"] * LIST_PRICE[0] + usage["completion_tokens"] * LIST_PRICE[1]) / 1e6


@pytest.mark.parametrize("api", APIS)
def test_a_batch_answers_every_row_with_the_online_calls_receipts_and_a_rerun_sends_nothing(
    demo: pb.demo.DemoServer, api: str, tmp_path: Path
) -> None:
    """One batch answers 40 rows into typed columns at half the list price; a rerun sends 0 requests; the online tool reads the same
    receipts, and asked afresh online it answers the same."""
    demo.reset(batch_seconds=30.0)
    frame, store = _companies(40), pb.ReceiptStore(tmp_path / "batch")
    out = run_virtual(frame.play.amap(_profiler(demo, api, mode="batch"), store=store, progress=False))
    assert (out.play_status == "ok").all() and set(out.industry) <= set(LABELS)
    served = demo.stats()
    assert served["batches_created"] == 1 and served["chat_batch"][MODELS[api]]["requests"] == 40
    assert pb.last_run().stats.cost_spent == round(_billed(served, api, 0.5), 9)  # type: ignore[union-attr]

    requests = served["requests"]
    again = run_virtual(frame.play.amap(_profiler(demo, api, mode="batch"), store=store, progress=False))
    assert pb.last_run().stats.calls_executed == 0 and demo.stats()["requests"] == requests  # type: ignore[union-attr]
    pd.testing.assert_frame_equal(again.drop(columns="play_status"), out.drop(columns="play_status"))

    online = run_virtual(frame.play.amap(_profiler(demo, api), store=store, progress=False))
    assert pb.last_run().stats.calls_executed == 0 and demo.stats()["requests"] == requests  # type: ignore[union-attr]
    fresh = run_virtual(
        frame.play.amap(_profiler(demo, api), store=pb.ReceiptStore(tmp_path / "online"), progress=False)
    )
    assert pb.last_run().stats.calls_executed == 40  # type: ignore[union-attr]
    for other in (online, fresh):
        pd.testing.assert_frame_equal(other.drop(columns="play_status"), out.drop(columns="play_status"))


@pytest.mark.parametrize("api", APIS)
def test_a_run_restarted_mid_batch_finds_its_batch_and_submits_nothing_twice(
    demo: pb.demo.DemoServer, api: str, tmp_path: Path
) -> None:
    """A run stopped while its batch is in progress; a new run over the same store polls the same batch: one batch made, 25 requests
    answered and billed once."""
    demo.reset(batch_seconds=600.0)
    frame, store = _companies(25), pb.ReceiptStore(tmp_path / "store")

    async def restarted() -> pd.DataFrame:
        first = asyncio.ensure_future(
            frame.play.amap(_profiler(demo, api, mode="batch"), store=store, progress=False)
        )
        while demo.stats()["batches_created"] == 0:
            await asyncio.sleep(0.5)
        await asyncio.sleep(5.0)  # its id is written down right after it is made
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        assert demo.stats()["chat_batch"] == {}  # still in progress: nothing answered yet
        return await frame.play.amap(_profiler(demo, api, mode="batch"), store=store, progress=False)

    out = run_virtual(restarted())
    served = demo.stats()
    assert (out.play_status == "ok").all()
    assert served["batches_created"] == 1 and served["chat_batch"][MODELS[api]]["requests"] == 25


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("made", [True, False], ids=["made", "never-made"])
def test_a_submission_whose_batch_id_was_never_written_down_is_found_or_sent_once(
    demo: pb.demo.DemoServer, api: str, made: bool, tmp_path: Path
) -> None:
    """Markers name a submission but no batch (its submitter died in between): the batch made is found (Anthropic's by its results,
    once it ends; Gemini's by its name), or, never made, the calls go out in one new batch."""
    from playbook.tools.llm.batch import batches_of, custom_id

    demo.reset(batch_seconds=120.0)
    llm = _llm(demo, api, mode="batch", output=Profile)
    asked = engine_of(llm)
    assert isinstance(asked, LlmEngine)
    frame = _companies(6)
    calls = [
        asked.bind(NO_INPUT, {"prompt": f"Classify {c} and summarise what it does."}) for c in frame.company
    ]
    store = pb.ReceiptStore(tmp_path / "store")

    async def died_before_writing_its_batch_down() -> pd.DataFrame:
        batches = batches_of(asked)
        keys = [asked.address(values) for values in calls]
        members = [
            (custom_id(key), asked.body(values["messages"])) for key, values in zip(keys, calls, strict=True)
        ]
        async with default_client() as client:  # the run's client: it reaches the demo served in process
            token = await batches.prepare(client, members)
            if made:
                await batches.create(client, token, members)
        for n, key in enumerate(keys):
            mark = {"api": api, "token": token, "at": time.time(), "id": custom_id(key), "n": n}
            await engine(store).commit(
                record(job_address(key), tool=llm.name, stored=mark, tagged=False, at=time.time())
            )
        return await frame.play.amap(_profiler(demo, api, mode="batch"), store=store, progress=False)

    out = run_virtual(died_before_writing_its_batch_down())
    served = demo.stats()
    assert (out.play_status == "ok").all()
    assert served["batches_created"] == 1 and served["chat_batch"][MODELS[api]]["requests"] == 6


def test_anthropic_requests_errored_or_expired_fail_only_their_rows_and_go_out_again_next_run(
    demo: pb.demo.DemoServer,
) -> None:
    """Message Batches: an empty user message is errored, a share of the requests expire: those rows fail saying so, the others are
    answered; the next run sends only the failed ones again."""
    demo.reset(batch_seconds=30.0, batch_expired_rate=0.4)
    llm = _llm(demo, "anthropic", mode="batch")
    frame = pd.DataFrame({"prompt": ["", *(f"Classify Company {i}" for i in range(19))]})
    out = run_virtual(frame.play.amap(_labeller(llm), progress=False))
    errors = out.play_error.fillna("")
    expired = errors.str.contains("expired: the batch reached its 24 hours")
    assert out.play_status[0] == "failed" and "errored: invalid_request_error" in errors[0]
    assert 0 < expired.sum() < 19 and (out.play_status[expired] == "failed").all()
    answered = ~expired & (out.index > 0)
    assert (out.play_status[answered] == "ok").all() and errors.str.contains("the next run submits it again")[
        expired
    ].all()
    assert demo.stats()["chat_batch"]["claude-sonnet-4-5"]["requests"] == answered.sum()

    demo.configure(batch_expired_rate=0.0)
    again = run_virtual(frame.play.amap(_labeller(llm), progress=False))
    assert (again.play_status[expired] == "ok").all() and (again.play_status[answered] == "reused").all()
    served = demo.stats()
    assert served["batches_created"] == 2 and served["chat_batch"]["claude-sonnet-4-5"]["requests"] == 19


def test_a_gemini_batch_that_expires_fails_its_rows_and_a_failed_request_only_its_own(
    demo: pb.demo.DemoServer,
) -> None:
    """Gemini: a batch that expires answers nothing, and each of its rows fails naming BATCH_STATE_EXPIRED; the next run's batch
    answers them, but for the empty user message it refuses, which fails alone."""
    demo.reset(batch_seconds=30.0, batch_expired_rate=1.0)
    llm = _llm(demo, "gemini", mode="batch")
    frame = pd.DataFrame({"prompt": ["Classify Acme Robotics", "", "Classify Globex"]})
    out = run_virtual(frame.play.amap(_labeller(llm), progress=False))
    assert (out.play_status == "failed").all() and out.play_error.str.contains("BATCH_STATE_EXPIRED").all()
    assert demo.stats()["chat_batch"] == {}

    demo.configure(batch_expired_rate=0.0)
    again = run_virtual(frame.play.amap(_labeller(llm), progress=False))
    assert list(again.play_status) == ["ok", "failed", "ok"]
    assert "HTTP 400 INVALID_ARGUMENT" in again.play_error[1]
    served = demo.stats()
    assert served["batches_created"] == 2 and served["chat_batch"]["gemini-2.5-flash"]["requests"] == 2


@pytest.mark.parametrize("api", APIS)
def test_the_estimate_of_a_batch_tool_shows_its_cost_against_the_online_cost(
    demo: pb.demo.DemoServer, api: str, tmp_path: Path
) -> None:
    """A pilot of a batch tool projects half the online cost and says what the calls would cost asked online, in its line and its
    table."""
    demo.reset(batch_seconds=0.5)
    frame = _companies(60)
    est = frame.play.estimate(
        _profiler(demo, api, mode="batch"),
        sample=10,
        store=pb.ReceiptStore(tmp_path / "s"),
        progress=False,
    )
    assert est.cost > 0 and est.online_cost == pytest.approx(2 * est.cost, rel=1e-4)
    assert (
        "asked online" in str(est)
        and "'llm' sends its calls as batch jobs, answered within 24 hours" in str(est)
        and est.to_dict()["online_cost"] == pytest.approx(est.online_cost)
    )
    line = est.table.set_index("tool").loc["llm"]
    assert line["online_cost"] == pytest.approx(2 * line["cost"], rel=1e-4)


def test_calls_heavier_than_one_gemini_batch_takes_go_out_in_several(
    demo: pb.demo.DemoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemini's inlined requests have a size cap (20 MB): calls weighing more than one batch takes (the cap shrunk to a few requests
    here) go out in several batches, each row answered once."""
    from playbook.tools.llm.batch import GeminiBatches

    monkeypatch.setattr(GeminiBatches, "most_bytes", 1_000)
    demo.reset(batch_seconds=30.0)
    out = run_virtual(_companies(12).play.amap(_profiler(demo, "gemini", mode="batch"), progress=False))
    served = demo.stats()
    assert (out.play_status == "ok").all()
    assert served["batches_created"] >= 3 and served["chat_batch"]["gemini-2.5-flash"]["requests"] == 12
