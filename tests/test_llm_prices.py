"""What an LLM call costs without ``prices=``: the price table of the ``genai-prices`` package for
the model that answered (cached input at its cache price, a batch job's answers at the batch
price), ``prices=`` over it, and a model no table knows counted as unpriced, never 0: in the run's
stats and views, the estimate, ``store.spend()`` and ``max_cost``.  The provider is the demo's;
every expected cost is computed from the table's own numbers."""

from __future__ import annotations

import asyncio
import copy
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from genai_prices import Usage, calc_price
from vtime import run_virtual

import playbook as pb
from playbook.tools import engine_of
from playbook.ui.html import counters_table
from playbook.ui.text import TextView

MODEL = "gpt-4o-mini"  # a model the table knows, and the demo answers as any other
KEY = pb.secret("PLAYBOOK_TEST_LLM_KEY", default="demo-key")


def _table(
    prompt: int, completion: int, *, cached: int = 0, batch: bool = False, model: str = MODEL
) -> float:
    """What the table itself says these tokens cost at OpenAI."""
    price = calc_price(
        Usage(input_tokens=prompt, cache_read_tokens=cached, output_tokens=completion),
        model,
        provider_id="openai",
        price_context={"processing": "batch"} if batch else None,
    )
    return float(price.total_price)


def _served(demo: pb.demo.DemoServer, kind: str = "chat", model: str = MODEL) -> tuple[int, int]:
    usage = demo.stats()[kind][model]
    return usage["prompt_tokens"], usage["completion_tokens"]


def _llm(demo: pb.demo.DemoServer, model: str = MODEL, **options: Any) -> pb.Tool:
    return pb.llm_tool(model=model, base_url=demo.url + "/v1", secret=KEY, **options)


def _label(llm: pb.Tool, name: str = "label") -> pb.Play:
    async def label(row: Any, ctx: pb.Context) -> Any:
        return await ctx.tool(llm, prompt=f"Classify {row.company}")

    return pb.play(label, name=name)


def _companies(n: int) -> pd.DataFrame:
    return pd.DataFrame({"company": [f"Company {i}" for i in range(n)]})


def test_a_known_model_costs_its_usage_at_the_tables_price(demo: pb.demo.DemoServer, tmp_path: Path) -> None:
    """No prices=: 12 calls of gpt-4o-mini cost the demo's counted usage at the table's price, and
    store.spend() says the same; a rerun saves it."""
    store = pb.ReceiptStore(tmp_path / "store")
    play = _label(_llm(demo))
    _companies(12).play.map(play, store=store, progress=False)
    stats = pb.last_run().stats  # type: ignore[union-attr]
    expected = _table(*_served(demo))
    assert expected > 0 and stats.calls_executed == 12 and stats.calls_unpriced == 0
    assert stats.cost_spent == pytest.approx(expected, rel=1e-9, abs=1e-9)
    spend = store.spend(by="tool")
    assert spend["cost_paid"].sum() == pytest.approx(stats.cost_spent, abs=1e-9)
    assert spend["calls_unpriced"].sum() == 0
    _companies(12).play.map(play, store=store, progress=False)
    again = pb.last_run().stats  # type: ignore[union-attr]
    assert again.cost_spent == 0 and again.cost_saved == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_a_newer_table_reprices_the_receipts_as_they_are_replayed(
    demo: pb.demo.DemoServer, tmp_path: Path
) -> None:
    """Receipts keep usage, not cost: with a newer table in the process (as genai_prices.UpdatePrices
    puts one), calls answered by receipts are priced at its prices."""
    from genai_prices import data_snapshot
    from genai_prices.types import ModelPrice

    store = pb.ReceiptStore(tmp_path / "store")
    llm = _llm(demo)
    _companies(8).play.map(_label(llm), store=store, progress=False)
    prompt, completion = _served(demo)
    newer = copy.deepcopy(data_snapshot.get_snapshot())
    newer.from_auto_update = True
    _, model = newer.find_provider_model(MODEL, None, "openai", None)
    model.prices, model.price_variants = ModelPrice(input_mtok=Decimal(3), output_mtok=Decimal(7)), None
    data_snapshot.set_custom_snapshot(newer)
    try:
        _companies(8).play.map(_label(llm, "relabel"), store=store, progress=False)
    finally:
        data_snapshot.set_custom_snapshot(None)
    again = pb.last_run().stats  # type: ignore[union-attr]
    assert again.calls_reused == 8
    assert again.cost_saved == pytest.approx((prompt * 3 + completion * 7) / 1e6, rel=1e-9)


@pytest.mark.parametrize(
    ("api", "model", "provider"),
    [
        ("anthropic", "claude-sonnet-4-5", "anthropic"),
        ("gemini", "gemini-2.5-flash", "google"),
        ("openai-responses", "gpt-4o-mini", "openai"),
        ("azure", "gpt-4o", "azure"),
    ],
)
def test_each_dialect_is_priced_at_its_own_provider(
    demo: pb.demo.DemoServer, api: str, model: str, provider: str
) -> None:
    """A dialect's calls cost the table's price at that dialect's provider (Google for Gemini),
    for the usage the demo counted in that dialect."""
    base = demo.url + "/v1" if api == "openai-responses" else demo.url
    options: dict[str, Any] = {"api_version": "2024-10-21"} if api == "azure" else {}
    llm = pb.llm_tool(api=api, model=model, base_url=base, secret=KEY, **options)
    out = _companies(6).play.map(_label(llm), progress=False)
    assert (out.play_status == "ok").all(), out.play_error.dropna().head(1).tolist()
    used = demo.stats()["by_api"][api]
    expected = calc_price(
        Usage(input_tokens=used["input_tokens"], output_tokens=used["output_tokens"]),
        model,
        provider_id=provider,
    )
    stats = pb.last_run().stats  # type: ignore[union-attr]
    assert float(expected.total_price) > 0 and stats.calls_unpriced == 0
    assert stats.cost_spent == pytest.approx(float(expected.total_price), rel=1e-9, abs=1e-9)


def test_cached_input_tokens_cost_the_cache_read_price(demo: pb.demo.DemoServer) -> None:
    """An answer with 600 of its 1,000 prompt tokens read from the cache costs what the table says
    for that split (the answering model's dated name found), less than with none cached."""
    llm = engine_of(_llm(demo))
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 100,
        "total_tokens": 1100,
        "prompt_tokens_details": {"cached_tokens": 600},
    }
    cost = llm.spent({"model": "gpt-4o-mini-2024-07-18", "usage": usage, "requests": 1}).cost
    assert cost == pytest.approx(_table(1000, 100, cached=600), rel=1e-9)
    assert cost is not None and cost < _table(1000, 100)


def test_a_batch_jobs_answers_cost_the_tables_batch_price(demo: pb.demo.DemoServer) -> None:
    """mode="batch": 20 calls answered by one batch job cost their usage at the table's batch price."""
    demo.reset(batch_seconds=0.5)
    llm = _llm(demo, mode="batch")
    out = run_virtual(_companies(20).play.amap(_label(llm), progress=False))
    assert (out.play_status == "ok").all()
    expected = _table(*_served(demo, "chat_batch"), batch=True)
    assert 0 < expected < _table(*_served(demo, "chat_batch"))
    assert pb.last_run().stats.cost_spent == pytest.approx(expected, rel=1e-9, abs=1e-9)  # type: ignore[union-attr]


def test_prices_given_override_the_table(demo: pb.demo.DemoServer) -> None:
    """prices= prices the tool's calls, not the table: (input, output), cached input at the input
    price, or a third price for it; a batch job's answer at half."""
    usage = {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 400}}
    answer = {"model": MODEL, "usage": usage, "requests": 1}
    two = engine_of(_llm(demo, prices={MODEL: (1.0, 2.0)}))
    assert two.spent(answer).cost == pytest.approx((1000 * 1.0 + 100 * 2.0) / 1e6)
    three = engine_of(_llm(demo, prices={MODEL: (1.0, 2.0, 0.25)}))
    assert three.spent(answer).cost == pytest.approx((600 * 1.0 + 400 * 0.25 + 100 * 2.0) / 1e6)
    assert three.spent({**answer, "batch": True}).cost == pytest.approx((600 + 100 + 200) / 2e6)
    with pytest.raises(pb.PlayDefinitionError, match="or \\(input, output, cached_input\\)"):
        _llm(demo, prices={MODEL: (1.0, 2.0, 3.0, 4.0)})


def test_an_unknown_model_is_unpriced_never_zero(demo: pb.demo.DemoServer, tmp_path: Path) -> None:
    """No price for demo-1 (nor usage in an answer): each call costs None, counted as unpriced in
    the stats, the summary, the counters table and store.spend(), and cost_spent leaves them out."""
    store = pb.ReceiptStore(tmp_path / "store")
    llm = _llm(demo, model="demo-1")
    assert engine_of(llm).spent({"model": "demo-1", "usage": {"prompt_tokens": 9}}).cost is None
    # an answer that says no usage (some local servers) has no cost to count, even for a known model
    silent = pb.llm_tool("silent", model=MODEL, base_url=demo.url + "/v1", prices={MODEL: (1.0, 1.0)})
    assert engine_of(silent).spent({"model": MODEL, "usage": None}).cost is None
    out = io.StringIO()

    async def main() -> pb.Run:
        run = await _companies(6).play.arun(_label(llm), store=store, progress=False, background=True)
        TextView(run.state, file=out, clock=asyncio.get_running_loop().time)
        await asyncio.wait([run._task])
        return run

    run = run_virtual(main())
    stats = run.stats
    assert stats.calls_executed == 6 and stats.calls_unpriced == 6 and stats.cost_spent == 0
    summary = next(line for line in out.getvalue().splitlines() if line.startswith("label: 6 rows"))
    assert "cost unpriced spent, $0.00 saved (6 calls of 'llm' unpriced: no price for the model)" in summary
    # cost spent, of it on failures, cost saved
    assert counters_table(stats).endswith(
        "<td>unpriced</td><td>$0.00</td><td>$0.00</td></tr></tbody></table>"
    )
    spend = store.spend(by="tool")
    assert spend.loc[spend.tool == "llm", ["calls_paid", "calls_unpriced"]].values.tolist() == [[6, 6]]
    assert spend.loc[spend.tool == "llm", "cost_paid"].isna().all()  # not known: NaN, not 0
    # another play's calls answered by those receipts: reused, and still unpriced
    _companies(6).play.map(_label(llm, "relabel"), store=store, progress=False)
    again = pb.last_run().stats  # type: ignore[union-attr]
    assert again.calls_reused == 6 and again.reused_unpriced == 6 and "unpriced" in counters_table(again)
    # the rows reused whole from their memos: their calls are unpriced too, not $0 saved
    _companies(6).play.map(_label(llm), store=store, progress=False)
    memos = pb.last_run().stats  # type: ignore[union-attr]
    assert (memos.reused, memos.calls_reused, memos.reused_unpriced) == (6, 6, 6)
    assert counters_table(memos).endswith(
        "<td>$0.00</td><td>$0.00</td><td>unpriced</td></tr></tbody></table>"
    )
    spend = store.spend(by="tool").set_index("tool")
    assert spend.loc["play label", "reused_unpriced"] == 6


def test_max_cost_refuses_a_tool_it_cannot_price_before_sending_anything(demo: pb.demo.DemoServer) -> None:
    """max_cost with a tool whose model has no price: the run stops at its first call, naming the
    tool and the model, and the provider saw no request."""
    llm = _llm(demo, model="demo-1")
    with pytest.raises(pb.RunFatal, match=r"max_cost=\$1\.00 cannot count tool 'llm'.*'demo-1'"):
        _companies(5).play.map(_label(llm), progress=False, max_cost=1.0)
    assert demo.stats()["requests"] == 0
    priced = _llm(demo, model="demo-1", prices={"demo-1": (1.0, 1.0)})
    out = _companies(5).play.map(_label(priced), progress=False, max_cost=1.0)
    assert (out.play_status == "ok").all()


def test_the_estimate_uses_the_runs_prices_and_says_unpriced(
    demo: pb.demo.DemoServer, tmp_path: Path
) -> None:
    """The pilot's calls cost the table's price for their usage; an unpriced tool's line is
    missing (not 0) in the estimate's table and named in its words and JSON."""
    frame = _companies(40)
    est = frame.play.estimate(_label(_llm(demo)), store=pb.ReceiptStore(tmp_path / "a"), progress=False)
    assert est.pilot.cost_spent == pytest.approx(_table(*_served(demo)), rel=1e-9, abs=1e-9)
    assert est.cost > 0 and est.unpriced == ()
    demo.reset()
    unknown = frame.play.estimate(
        _label(_llm(demo, model="demo-1")), store=pb.ReceiptStore(tmp_path / "b"), progress=False
    )
    assert unknown.unpriced == ("llm",) and unknown.pilot.calls_unpriced == unknown.pilot.calls_executed > 0
    assert "cost unpriced ('llm')" in str(unknown)
    assert unknown.table["cost"].isna().all()
    [line] = [row.split() for row in unknown.text().splitlines()[1:] if " llm " in row]
    assert line[line.index("llm") + 5] == "unpriced"  # its cost cell: after paid, reused, shared, per
    assert "<td>unpriced</td>" in unknown._repr_html_()
    assert unknown.to_dict()["unpriced"] == ["llm"] and unknown.to_dict()["table"][0]["cost"] is None
