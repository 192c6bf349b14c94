"""``df.play.estimate``: a pilot on a sample of the rows a run would run, projected over the rest;
``estimate=True`` asks before the run goes on.  The provider is the demo's (a real HTTP server),
whose counters say what was paid; the projection's arithmetic is checked on logs made by hand."""

from __future__ import annotations

import builtins
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pytest

import playbook as pb
from playbook.providers.status import Budget, ProviderStatus
from playbook.runtime.estimate.distinct import Counted
from playbook.runtime.estimate.pilot import FIELDS, Pilot, PilotLog
from playbook.runtime.estimate.projection import project


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"domain": [f"company{i}.com" for i in range(n)], "first": [f"P{i}" for i in range(n)]}
    )


def _play(demo: pb.demo.DemoServer, provider: pb.Provider, cost: float = 0.5) -> pb.Play:
    email = pb.demo.email_tool(demo, provider=provider, cost=cost)

    async def enrich(row: Any, ctx: pb.Context) -> Any:
        return {"email": await ctx.tool(email, domain=row.domain, first=row.first)}

    return pb.play(enrich, name="enrich")


def test_a_pilot_projects_the_calls_and_money_left_and_the_run_pays_none_of_its_calls_again(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """200 rows, one call of 0.5 each, 40 of them done before: the pilot runs 20 of the 160 left
    (paying 20 calls), projects 140 calls and 70.0 for the rest, and the run after it pays for
    exactly those 140 calls."""
    play = _play(demo, pb.Provider("acme", rps=200))
    frame = _frame(200)
    frame.iloc[:40].play.map(play, store=store, progress=False)
    demo.reset()
    est = frame.play.estimate(play, store=store, progress=False)
    assert demo.stats()["requests"] == 20 and est.pilot.calls_executed == 20 and est.sample == 20
    assert (est.rows, est.reused_rows, est.rows_left, est.paid_calls, est.cost) == (200, 60, 140, 140, 70.0)
    assert est.interval["paid_calls"] == (140.0, 140.0) and est.bottleneck == "acme"
    assert list(est.table[["provider", "tool", "paid_calls", "cost"]].itertuples(index=False, name=None)) == [
        ("acme", "demo.email", 140, 70.0)
    ]
    run = frame.play.run(play, store=store, progress=False)
    assert run.stats.calls_executed == 140 == demo.stats()["requests"] - 20 and run.stats.reused == 60
    assert "200 rows: 60 already done; ~140 paid calls, $70.00" in str(est) and "'acme'" in str(est)
    assert "<table" in est._repr_html_() and json.loads(json.dumps(est.to_dict()))["paid_calls"] == 140


def test_a_frame_answered_by_its_memos_is_estimated_free_without_a_request(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    play = _play(demo, pb.Provider("acme"))
    frame = _frame(30)
    frame.play.map(play, store=store, progress=False)
    before = demo.stats()["requests"]
    est = frame.play.estimate(play, store=store, progress=False)
    assert (est.paid_calls, est.cost, est.seconds, est.rows_left, est.reused_rows) == (0, 0.0, 0.0, 0, 30)
    assert demo.stats()["requests"] == before and "nothing left to pay for" in str(est)


def test_the_pilot_counts_the_rows_it_ran_not_the_frame(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pilot's run counts its sample and the rows its memos answered, not the frame's rows it
    left alone: its stats and the summary it prints say 30 rows of a 300-row frame."""
    play = _play(demo, pb.Provider("acme", rps=200))
    frame = _frame(300)
    frame.iloc[:10].play.map(play, store=store, progress=False)
    capsys.readouterr()
    est = frame.play.estimate(play, store=store, progress="text")
    said = capsys.readouterr().err
    assert (est.pilot.total, est.pilot.ok, est.pilot.reused, est.pilot.skipped) == (30, 20, 10, 0)
    assert "enrich: 30 rows | ok 20 | reused 10 | failed 0" in said and "300 rows" not in said.split("\n")[-2]


def test_estimate_true_with_nothing_left_shows_one_summary_and_gives_every_row(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """estimate=True over a frame whose rows are all done: nothing is asked, one summary is printed
    (all the rows, reused), and the result has every row."""
    play = _play(demo, pb.Provider("acme"))
    frame = _frame(30)
    frame.play.map(play, store=store, progress=False)
    capsys.readouterr()
    out = frame.play.map(play, store=store, estimate=True, progress="text")
    said = capsys.readouterr().err
    summaries = [
        line for line in said.splitlines() if " saved | " in line
    ]  # a summary's line: what it cost and saved
    assert len(summaries) == 1 and summaries[0].startswith("enrich: 30 rows | ok 0 | reused 30"), said
    assert out["play_status"].tolist() == ["reused"] * 30 and pb.last_run().stats.reused == 30


def test_the_sample_is_random_with_a_seed_or_the_first_rows(demo: pb.demo.DemoServer, tmp_path: Path) -> None:
    play = _play(demo, pb.Provider("acme"))
    frame = _frame(100)
    runs = []
    for i, how in enumerate(({"seed": 7}, {"seed": 7}, {"first": True})):
        frame.play.estimate(play, sample=5, store=tmp_path / str(i), progress=False, **how)
        runs.append(sorted(pb.ReceiptStore(tmp_path / str(i)).receipts()["input"].map(lambda v: v["first"])))
    assert runs[0] == runs[1] != runs[2] and runs[2] == sorted(f"P{i}" for i in range(5))


def test_bad_samples_and_options_are_refused_naming_them(
    store: pb.ReceiptStore, demo: pb.demo.DemoServer
) -> None:
    play = _play(demo, pb.Provider("acme"))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(pb.PlayDefinitionError, match=r"estimate\(sample="):
            _frame(5).play.estimate(play, sample=bad, store=store)  # type: ignore[arg-type]
    with pytest.raises(
        pb.PlayDefinitionError, match="unknown run option 'concurency'; did you mean 'concurrency'"
    ):
        _frame(5).play.estimate(play, store=store, concurency=3)  # type: ignore[call-arg]
    assert demo.stats()["requests"] == 0


def _answer(monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    """What the user types when asked (outside a notebook the question itself goes to stderr)."""
    monkeypatch.setattr(builtins, "input", lambda prompt="": answer)


def test_estimate_true_asks_and_a_no_runs_nothing_more(
    demo: pb.demo.DemoServer,
    store: pb.ReceiptStore,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """estimate=True: the pilot runs, the estimate and the question go to stderr, naming the rows
    left (and a max_cost short of them); no: the rows not piloted are skipped, saying why; yes:
    the rest runs, within what the pilot left of max_cost."""
    play = _play(demo, pb.Provider("acme"), cost=1.0)
    _answer(monkeypatch, "n")
    out = _frame(50).play.map(play, store=store, estimate=True, max_cost=60, progress=False)
    said = capsys.readouterr()
    assert said.out == "" and "50 rows: 20 already done; ~30 paid calls, $30.00" in said.err
    assert said.err.endswith("\nrun the 30 rows left? [y/N] ")  # 40 left of max_cost after the pilot: enough
    assert (
        out["play_status"].value_counts().to_dict() == {"skipped": 30, "ok": 20}
        and demo.stats()["requests"] == 20
    )
    declined = pb.last_run().stats  # the pilot's run, returned: the rows it left are skipped, and count in it
    assert (declined.total, declined.ok, declined.skipped) == (50, 20, 30)
    assert set(out.loc[out["play_status"] == "skipped", "play_error"]) == {
        "not run: the estimate was not accepted"
    }
    _answer(monkeypatch, "y")
    out = _frame(50).play.map(play, store=store, estimate=True, max_cost=25, progress=False)
    said = capsys.readouterr()
    assert (
        "\nmax_cost=25 leaves $5.00 after the pilot's $20.00, which is below what the 10 rows left will cost (at least $10.00"
        in said.err
    )
    spent = demo.stats()["requests"] - 20
    assert (
        spent <= 25 and out["play_status"].value_counts().get("parked", 0) == 50 - 20 - spent
    )  # the pilot's 20 count in max_cost


@pytest.mark.parametrize(
    "gone", [EOFError(), RuntimeError("input(): lost sys.stdin")], ids=["stdin at its end", "stdin closed"]
)
def test_estimate_true_with_nobody_to_ask_is_refused_saying_what_to_do(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch, gone: Exception
) -> None:
    def no_stdin(prompt: str = "") -> str:
        raise gone

    monkeypatch.setattr(builtins, "input", no_stdin)
    with pytest.raises(pb.PlayDefinitionError, match=r"nobody can be asked here.*--estimate --yes"):
        _frame(40).play.map(_play(demo, pb.Provider("acme")), store=store, estimate=True, progress=False)
    assert demo.stats()["requests"] == 20  # the pilot's, saved: the run reuses them


def test_a_polars_frame_is_estimated_as_a_pandas_one(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    est = pl.from_pandas(_frame(60)).play.estimate(
        _play(demo, pb.Provider("acme")), sample=10, store=store, progress=False
    )
    assert (est.rows_left, est.paid_calls, est.cost) == (50, 50, 25.0)


# -- the projection, on logs made by hand ------------------------------------------------------------


def _pilot(
    lines: dict[tuple[str | None, str], list[float]], rows: int, runnable: int, sample: int = 10
) -> Pilot:
    log = PilotLog()
    for position in range(sample):
        log.rows[position] = {where: list(line) for where, line in lines.items()}
    return Pilot(
        rows,
        rows - runnable + sample,
        runnable,
        list(range(sample)),
        list(range(sample)),
        [],
        {},
        log,
        pb.RunStats(),
    )


def _status(
    name: str, rate: float | None = None, in_flight: int | None = None, tpm: float | None = None
) -> ProviderStatus:
    return ProviderStatus(name, False, None, 0.0, False, 0.0, None, rate, in_flight, 0, 0, 0.0, tpm)


def _line(**values: float) -> list[float]:
    values.setdefault("online", values.get("cost", 0.0))  # asked online: no batch job paid less
    return [values.get(name, 0.0) for name in FIELDS]


def test_the_slowest_provider_is_the_bottleneck_by_rate_calls_in_flight_or_tokens() -> None:
    """1,010 runnable rows, 10 piloted: 1,000 left.  'fast' answers in 0.1 s at 100 rps; 'slow'
    is called by half the rows, 5 in flight of 1 s each; 'llm' takes 600 tokens a call at
    60,000 a minute."""
    lines = {
        ("fast", "a"): _line(paid=1, cost=0.01, sent=1, seconds=0.1),
        ("slow", "b"): _line(paid=0.5, cost=0.1, sent=0.5, seconds=0.5),
        ("llm", "c"): _line(paid=1, cost=0.001, tokens=600, sent=1, seconds=0.2),
    }
    statuses = {
        "fast": _status("fast", rate=100),
        "slow": _status("slow", in_flight=5),
        "llm": _status("llm", tpm=60_000),
    }
    est = project(_pilot(lines, 1_010, 1_010), "p", 50, statuses)
    assert est.rows_left == 1_000 and est.paid_calls == 2_500 and est.cost == pytest.approx(1000 * 0.111)
    shares = est.table.set_index("provider")["provider_seconds"]
    assert (
        shares["fast"] == pytest.approx(10.0)
        and shares["slow"] == pytest.approx(100.0)
        and shares["llm"] == pytest.approx(600.0)
    )
    assert (
        est.bottleneck == "llm" and est.limit == "60k tokens a minute" and est.seconds == pytest.approx(600.0)
    )
    assert "1,010 rows: 10 already done; ~2,500 paid calls (~600k tokens), $111.00, ~10m 00s" in str(est), (
        str(est)
    )
    llm = next(line for line in est.text().splitlines() if line.lstrip().startswith("llm"))
    assert llm.split()[:8] == ["llm", "c", "1000", "0", "0", "row", "$1.00", "600k"], (
        llm
    )  # money and tokens as the line says them
    est = project(_pilot(lines, 1_010, 1_010), "p", 50, {**statuses, "llm": _status("llm", tpm=600_000)})
    assert (
        est.bottleneck == "slow"
        and est.limit == "5 calls in flight of 1s"
        and est.seconds == pytest.approx(100.0)
    )


def test_input_and_output_token_budgets_bound_the_estimate_apart() -> None:
    """Calls of 600 input and 200 output tokens under 400k input and 8,000 output tokens a minute:
    1,000 calls take 1,500 s, bound by the output budget (the input one would allow 240 s)."""
    lines = {("anthropic", "c"): _line(paid=1, cost=0.001, tokens=800, output=200, sent=1, seconds=0.2)}
    budgets = (Budget("input tokens", 0.0, 400_000.0), Budget("output tokens", 0.0, 8_000.0))
    statuses = {"anthropic": _status("anthropic")._replace(budgets=budgets)}
    est = project(_pilot(lines, 1_010, 1_010), "p", 50, statuses)
    assert est.bottleneck == "anthropic" and est.limit == "8,000 output tokens a minute"
    assert est.seconds == pytest.approx(1_500.0)


def test_a_configured_window_bounds_the_rate_per_key_of_a_pool() -> None:
    """A window of 120 calls an hour sends 1,000 calls in 30,000 s whatever the calls in flight;
    a pool's keys add up, each bounded by its own window or rate (HEADROOM: 0.98 of the rps)."""
    line = {("p", "a"): _line(paid=1, sent=1, seconds=0.1)}
    alone = pb.Provider("est-window", window=(120, 3600)).status()
    est = project(_pilot(line, 1_010, 1_010), "p", 50, {"p": alone})
    assert est.seconds == pytest.approx(30_000.0) and est.limit == "0.0333 rps"
    keys = [pb.secret("EST_KEY_A"), pb.secret("EST_KEY_B")]
    pool = pb.Provider("est-pool", keys=keys, rps=[10, 10], window=[(60, 60), None]).status()
    est = project(_pilot(line, 1_010, 1_010), "p", 50, {"p": pool})
    assert est.seconds == pytest.approx(1_000 / (1.0 + 9.8)) and est.limit == "10.8 rps"


def test_a_run_held_by_its_own_concurrency_names_the_provider_it_waits_on_most() -> None:
    lines = {
        ("a", "x"): _line(paid=1, sent=1, seconds=2.0, span=2.0),
        ("b", "y"): _line(paid=1, sent=1, seconds=0.5, span=0.5),
    }
    est = project(_pilot(lines, 110, 110), "p", 4, {"a": _status("a"), "b": _status("b")})
    assert (
        est.seconds == pytest.approx(100 * 2.5 / 4)
        and est.bottleneck == "a"
        and "concurrency (4 rows" in est.limit
    )


def test_the_interval_spreads_with_the_rows_and_holds_the_point() -> None:
    """Half the rows miss on the first leg and pay a second: the bootstrap's interval holds the
    point projection and is wider than nothing."""
    log = PilotLog()
    for position in range(20):
        log.rows[position] = {("a", "first"): _line(paid=1, cost=1, sent=1, seconds=0.1)}
        if position % 2:
            log.rows[position][("b", "second")] = _line(paid=1, cost=3, sent=1, seconds=0.1)
    pilot = Pilot(1_020, 20, 1_020, list(range(20)), list(range(20)), [], {}, log, pb.RunStats())
    est = project(pilot, "p", 16, {"a": _status("a"), "b": _status("b")})
    low, high = est.interval["cost"]
    assert (
        est.cost == pytest.approx(1000 * 2.5) and low < est.cost < high and np.isclose(est.paid_calls, 1500)
    )


def test_calls_counted_from_columns_are_paid_once_per_distinct_call_left_as_the_pilot_paid_one() -> None:
    """A tool counted from a column: the 1,000 rows left make 700 distinct calls, 150 rows' with a
    receipt already and 500 with none; the pilot rows that paid one paid 0.02: the projection
    pays 500 of them (the rest reused or shared), and the LLM, whose cost differs per row, per row."""
    log = PilotLog()
    for position in range(10):
        lookup = _line(paid=1, cost=0.02, sent=1, seconds=0.1) if position % 5 else _line(shared=1)
        log.rows[position] = {
            ("a", "lookup"): lookup,
            ("b", "llm"): _line(paid=1, cost=0.1 * (1 + position % 2), sent=1, seconds=0.1),
        }
    counted = {
        ("a", "lookup"): Counted(("domain",), rows=1_000, distinct=700, calls=500, reused=150, checked=700)
    }
    pilot = Pilot(1_010, 10, 1_010, list(range(10)), list(range(10)), [], {}, log, pb.RunStats(), counted)
    est = project(pilot, "p", 16, {"a": _status("a"), "b": _status("b")})
    table = est.table.set_index("tool")
    assert table.loc["lookup", ["paid_calls", "reused_calls", "shared_calls", "per"]].tolist() == [
        500,
        150,
        350,
        "distinct domain",
    ]
    assert table.loc["lookup", "cost"] == pytest.approx(10.0) and table.loc["llm", "per"] == "row"
    assert (
        est.paid_calls == 1_500
        and est.cost == pytest.approx(10.0 + 150.0)
        and est.interval["paid_calls"] == (1_500, 1_500)
    )
    low, high = est.interval["cost"]
    assert low < est.cost < high and "cost" not in est.no_spread
    assert est.no_spread["paid_calls"] == (
        "'lookup' is paid once per distinct domain: 500 left with no receipt; every pilot row paid 1 call of 'llm' (projected per row: "
        "the rows left are assumed to share its calls no more than the pilot's rows, which shared none; an input read from a column "
        "is counted per distinct value)"
    )


def test_a_tool_counted_from_columns_costs_what_an_answered_call_cost_not_its_refusals() -> None:
    """2 of 10 pilot rows' lookups were refused (a 4xx kept as the answer: a paid call, no money):
    the 500 distinct calls left with no receipt each cost what an answered one did (0.02), and
    the table counts the refusals apart from the requests that failed."""
    log = PilotLog()
    for position in range(10):
        refused = position < 2
        log.rows[position] = {
            ("a", "lookup"): _line(
                paid=1, cost=0.0 if refused else 0.02, sent=1, seconds=0.1, refused=refused
            )
        }
    counted = {
        ("a", "lookup"): Counted(("domain",), rows=1_000, distinct=700, calls=500, reused=150, checked=700)
    }
    est = project(
        Pilot(1_010, 10, 1_010, list(range(10)), list(range(10)), [], {}, log, pb.RunStats(), counted),
        "p",
        16,
        {"a": _status("a")},
    )
    assert est.cost == 10.0 and est.table[
        ["paid_calls", "refused_calls", "requests_failed"]
    ].values.tolist() == [[500, 0, 0.0]]


def test_projected_amounts_carry_no_float_noise_and_a_tool_with_no_provider_is_named_so() -> None:
    """3,741 rows left at 0.01 a row: the cost and its interval are 37.41, not 37.410000000000004;
    a paid tool made with no provider shows as such in the table, not as NaN."""
    est = project(_pilot({(None, "score"): _line(paid=1, cost=0.01)}, 3_751, 3_751), "p", 16, {})
    assert (est.cost, est.interval["cost"]) == (37.41, (37.41, 37.41)) and "37.41" in repr(est.interval)
    assert est.table[["provider", "tool", "paid_calls"]].values.tolist() == [
        ["(no provider)", "score", 3_741]
    ]


def test_free_local_calls_are_not_projected_and_refusals_are_paid_calls_not_failed_requests(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """A free local tool cleans each row's website (rows repeat some) before a paid lookup of
    the domain it gives, which the demo refuses (422) for an empty one: the local tool is in no
    note and no line of the table, and the refusals are paid calls at no money, not failed
    requests, as the pilot's own stats count them."""

    @pb.tool
    def clean_domain(website: Any) -> str:
        return str(website or "").strip().lower()

    company = pb.http_tool(
        "company",
        method="GET",
        url=demo.url + "/v1/company",
        params={"domain": "{domain}"},
        headers={"Authorization": "Bearer demo-key"},
        provider=pb.Provider("acme"),
        cost=0.01,
    )

    async def enrich(row: Any, ctx: pb.Context) -> Any:
        return {
            "name": (await ctx.tool(company, domain=await ctx.tool(clean_domain, website=row.website)))[
                "name"
            ]
        }

    websites = ["" if i % 4 == 0 else f" Company{i % 30}.com" for i in range(200)]
    frame = pd.DataFrame({"website": websites, "person": [f"P{i}" for i in range(200)]})
    est = frame.play.estimate(pb.play(enrich, name="enrich"), sample=40, store=store, progress=False)
    assert est.table["tool"].tolist() == ["company"] and not any(
        "clean_domain" in note for note in est.notes
    ), est.text()
    line = est.table.iloc[0]
    assert est.pilot.calls_failed == 0 and line["requests_failed"] == 0.0 and line["refused_calls"] > 0
    assert est.pilot.failed > 0


def test_calls_pilot_rows_shared_are_projected_in_the_pilot_share_and_spread_the_interval() -> None:
    """A tool projected per row: 4 of 20 pilot rows were answered by a call another pilot row
    paid for: the 1,000 rows left pay 800 calls and share 200, and the interval has width."""
    log = PilotLog()
    for position in range(20):
        log.rows[position] = {
            ("a", "lookup"): _line(shared=1)
            if position % 5 == 0
            else _line(paid=1, cost=1, sent=1, seconds=0.1)
        }
    est = project(
        Pilot(1_020, 20, 1_020, list(range(20)), list(range(20)), [], {}, log, pb.RunStats()),
        "p",
        16,
        {"a": _status("a")},
    )
    assert est.table[["paid_calls", "reused_calls", "shared_calls", "per"]].values.tolist() == [
        [800, 0, 200, "row"]
    ]
    low, high = est.interval["paid_calls"]
    assert low < 800 < high and est.no_spread == {"tokens": "no call the pilot paid counted tokens"}
    assert est.notes == [
        "4 of the pilot's 20 calls of 'lookup' were another pilot row's: the rows left are projected to share as many "
        "(their inputs are not read from columns; a frame that repeats them more pays less)"
    ]


# -- the command line ----------------------------------------------------------------------------------


PLAYS = """
import os
import random
import playbook as pb

email = pb.demo.email_tool(os.environ["DEMO_URL"], provider=pb.Provider("acme"), cost=0.25)

@pb.play
async def enrich(row, ctx):
    return {"email": await ctx.tool(email, domain=row.domain, first=row.first)}
"""


def test_the_command_line_estimates_and_runs_the_rest_only_with_yes(
    demo_loopback: pb.demo.DemoServer, tmp_path: Path
) -> None:
    """`python -m playbook run --estimate` prints the estimate and runs the rest only with --yes
    (on loopback: the command line is a process of its own, reaching the provider by socket)."""
    demo = demo_loopback
    (tmp_path / "plays.py").write_text(PLAYS)
    _frame(60).to_csv(tmp_path / "in.csv", index=False)
    env = {**os.environ, "DEMO_URL": demo.url}

    def cli(*extra: str) -> subprocess.CompletedProcess[str]:
        args = [
            "run",
            "plays.py:enrich",
            "--in",
            "in.csv",
            "--out",
            "out.csv",
            "--estimate",
            "--json",
            *extra,
        ]
        return subprocess.run(
            [sys.executable, "-m", "playbook", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = cli("--sample", "10")
    report = json.loads(first.stdout)
    assert (
        first.returncode == 0
        and report["estimate"]["paid_calls"] == 50
        and report["estimate"]["cost"] == 12.5
    )
    assert not (tmp_path / "out.csv").exists() and "add --yes to run the 50 rows left" in first.stderr
    assert demo.stats()["requests"] == 10
    second = cli("--yes", "--max-cost", "5", "--sample", "4")
    report = json.loads(second.stdout)
    assert (
        "--max-cost 5 leaves $4.00 after the pilot's $1.00, which is below what the 46 rows left will cost"
        in second.stderr
    )
    assert (
        report["estimate"]["rows_left"] == 46 and report["stats"]["cost_spent"] == 4.0
    )  # what the pilot (1.0) left of 5
    assert demo.stats()["requests"] == 10 + 4 + 16 and second.returncode == 3  # rows parked on the budget
    (tmp_path / "out.csv").unlink()
    third = cli("--sample", "60")  # the pilot runs every row left: still nothing is written without --yes
    assert (
        third.returncode == 0
        and not (tmp_path / "out.csv").exists()
        and "every row is done: add --yes to write them" in third.stderr
    )
    fourth = cli("--yes")  # nothing left: one summary (the pilot's), and every row written
    assert fourth.returncode == 0 and len(pd.read_csv(tmp_path / "out.csv")) == 60
    assert len([line for line in fourth.stderr.splitlines() if " saved | " in line]) == 1, fourth.stderr
    (tmp_path / "out.csv").unlink()
    bad = cli("--precision", "15")
    assert bad.returncode == 2 and "a share between 0 and 1, such as 0.15" in bad.stderr
    for alone in (["--sample", "5"], ["--yes"], ["--precision", "0.1"]):
        args = ["run", "plays.py:enrich", "--in", "in.csv", "--out", "out.csv", *alone]
        done = subprocess.run(
            [sys.executable, "-m", "playbook", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (
            done.returncode == 2
            and f"{alone[0]} is for --estimate" in done.stderr
            and not (tmp_path / "out.csv").exists()
        )


def test_a_pilot_answered_by_fixtures_sends_nothing_and_names_no_bottleneck(
    demo: pb.demo.DemoServer, tmp_path: Path
) -> None:
    """Fixtures answer the pilot as they would the run: no request, the money the recorded answers
    cost, no time, no provider holding anything back."""
    play = _play(demo, pb.Provider("acme"), cost=0.1)
    frame = _frame(50)
    with pb.fixtures(tmp_path / "calls.jsonl", mode="record"):
        frame.play.map(play, store=tmp_path / "recorded", progress=False)
    sent = demo.stats()["requests"]
    est = frame.play.estimate(
        play, fixtures=tmp_path / "calls.jsonl", store=tmp_path / "replayed", progress=False
    )
    assert demo.stats()["requests"] == sent == 50
    assert (est.rows_left, est.paid_calls, est.cost, est.seconds, est.bottleneck) == (
        30,
        30,
        pytest.approx(3.0),
        0.0,
        None,
    )
    assert "held back" not in str(est)


def test_pilot_rows_the_budget_parked_are_not_projected_as_free(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """max_cost parks half the pilot: the projection is made of the 10 rows that ran, over the 190
    rows left, and says so."""
    est = _frame(200).play.estimate(
        _play(demo, pb.Provider("acme"), cost=0.1), max_cost=1, store=store, progress=False
    )
    assert (est.reused_rows, est.rows_left, est.paid_calls, est.cost) == (10, 190, 190, pytest.approx(19.0))
    assert est.notes == [
        "10 of the pilot's rows did not end (10 parked (budget)): projected from the 10 that did"
    ]
    assert est.notes[0] in str(est)


def test_failures_in_the_pilot_are_projected_with_what_they_cost(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """Every fourth row fails after a paid call: the estimate projects how many of the rest fail
    and what their calls cost, and the run after it fails about as many."""
    email = pb.demo.email_tool(demo, provider=pb.Provider("acme"), cost=0.5)

    async def picky(row: Any, ctx: pb.Context) -> Any:
        found = await ctx.tool(email, domain=row.domain, first=row.first)
        if int(row.first[1:]) % 4 == 0:
            raise ValueError("not wanted")
        return {"email": found}

    frame = _frame(120)
    est = frame.play.estimate(picky, sample=40, first=True, store=store, progress=False)
    assert (est.rows_left, est.paid_calls, est.failed_rows, est.cost_failed) == (
        90,
        80,
        20,
        pytest.approx(10.0),
    )
    assert (
        "10 of the pilot's 40 rows failed (pb.last_run().errors): ~20 of the rest may, paying ~$10.00"
        in str(est)
    )
    run = frame.play.run(picky, store=store, progress=False)
    assert (
        run.stats.failed == 30 and run.stats.calls_executed == 80 and run.stats.cost_failed == 10.0
    )  # the pilot's 10 replayed free


def test_rows_sharing_a_key_are_counted_as_rows_and_paid_once(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    frame = pd.concat([_frame(20)] * 10, ignore_index=True)  # 200 rows, 20 different
    est = frame.play.estimate(
        _play(demo, pb.Provider("acme")), sample=10, first=True, store=store, progress=False
    )
    assert (est.rows, est.reused_rows, est.rows_left, est.paid_calls) == (200, 100, 100, 10)
    assert est.pilot.total == est.pilot.ok == 100  # its 10 rows and their copies
    frame.play.map(_play(demo, pb.Provider("acme")), store=store, progress=False)
    assert demo.stats()["requests"] == 20


def _waterfall(demo: pb.demo.DemoServer) -> Any:
    """A play whose first leg misses half the time and whose second costs 3 times the first."""
    demo.reset(miss_rate=0.5)
    first = pb.demo.email_tool(demo, name="first", provider=pb.Provider("leg-a"), cost=0.01)
    second = pb.demo.email_tool(demo, name="second", provider=pb.Provider("leg-b"), cost=0.03)

    async def both(row: Any, ctx: pb.Context) -> Any:
        legs = [
            ctx.leg(first, domain=row.domain, first=row.first),
            ctx.leg(second, domain="mail." + row.domain, first=row.first),
        ]
        return {"email": await ctx.waterfall("email", legs)}

    return both


def test_with_precision_the_pilot_grows_until_its_interval_is_narrow_enough(
    demo: pb.demo.DemoServer, tmp_path: Path
) -> None:
    """A waterfall whose second leg costs 3 times the first and is asked for about half the rows:
    a pilot of 10 rows has a wide interval; precision=0.1 grows it 10 rows at a time, to at most
    100, and its interval narrows; a play of one call a row is narrow at once and stays at 10."""
    both = _waterfall(demo)

    frame = _frame(400)
    fixed = frame.play.estimate(both, sample=10, store=tmp_path / "fixed", progress=False)
    grown = frame.play.estimate(both, sample=10, precision=0.1, store=tmp_path / "grown", progress=False)
    width = [(e.interval["cost"][1] - e.interval["cost"][0]) / e.cost for e in (fixed, grown)]
    assert fixed.sample == 10 and 10 < grown.sample <= 100 and grown.sample % 10 == 0
    assert (fixed.pilot.total, grown.pilot.total) == (
        fixed.sample,
        grown.sample,
    )  # each round adds the rows it ran
    assert width[1] < width[0] and (width[1] / 2 <= 0.1 or grown.sample == 100)
    assert (
        grown.pilot.calls_executed == demo.stats()["requests"] - fixed.pilot.calls_executed
    )  # every pilot row paid once
    plain = frame.play.estimate(
        _play(demo, pb.Provider("acme")), sample=10, precision=0.1, store=tmp_path / "plain", progress=False
    )
    assert plain.sample == 10
    for bad in (0, 1.5, "0.1", True):
        with pytest.raises(pb.PlayDefinitionError, match=r"estimate\(precision="):
            frame.play.estimate(both, precision=bad, store=tmp_path / "bad")  # type: ignore[arg-type]


# -- calls rows share, and what the interval says -------------------------------------------------


def _repeating(n: int, seed: int) -> pd.DataFrame:
    """``n`` rows, about one in six repeating an earlier row's domain; each row its own person and text."""
    rng = random.Random(seed)
    domains: list[str] = []
    for i in range(n):
        domains.append(rng.choice(domains) if domains and rng.random() < 1 / 6 else f"company{i}.com")
    words = ["harbour", "lantern", "quarry", "meadow", "orchard", "copper", "saddle", "beacon"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(40, 60))) for _ in range(n)]
    return pd.DataFrame({"domain": domains, "person": [f"P{i}" for i in range(n)], "text": texts})


def _company(demo: pb.demo.DemoServer) -> pb.Tool:
    return pb.http_tool(
        "company",
        method="GET",
        url=demo.url + "/v1/company",
        params={"domain": "{domain}"},
        headers={"Authorization": "Bearer demo-key"},
        provider=pb.Provider("est-company"),
        cost=0.01,
    )


def _company_then_llm(demo: pb.demo.DemoServer) -> pb.Play:
    """An HTTP tool called with the row's domain, then an LLM with a prompt of the row's own."""
    company = _company(demo)
    llm = pb.llm_tool(
        model="demo-1",
        base_url=demo.url + "/v1",
        secret=pb.secret("DEMO_API_KEY", default="demo-key"),
        prices={"demo-1": (0.15, 0.60)},
        provider=pb.Provider("est-llm"),
    )

    async def outreach(row: Any, ctx: pb.Context) -> Any:
        found = await ctx.tool(company, domain=row.domain)
        return {"note": await ctx.tool(llm, prompt=f"Write to {row.person} at {found['name']}: {row.text}")}

    return pb.play(outreach, name="outreach")


def test_calls_rows_share_are_projected_once_per_distinct_domain_and_the_interval_holds_the_run(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """300 rows, one in six repeating an earlier domain: the company lookup is paid once per
    domain and the LLM once per row; the estimate counts the domains left with no receipt (the
    pilot's own are free), lands within 5% of the run's calls and money, and its intervals hold them."""
    frame = _repeating(300, seed=6)
    play = _company_then_llm(demo)
    est = frame.play.estimate(play, sample=20, store=store, progress=False)
    run = frame.play.run(play, store=store, progress=False)
    paid, spent = run.stats.calls_executed, run.stats.cost_spent
    assert (
        paid == demo.stats()["requests"] - est.pilot.calls_executed
    )  # every request the run sent was a paid call
    assert abs(est.paid_calls / paid - 1) <= 0.05 and abs(est.cost / spent - 1) <= 0.05
    assert est.interval["paid_calls"][0] <= paid <= est.interval["paid_calls"][1]
    assert (
        est.interval["cost"][0] <= spent <= est.interval["cost"][1]
        and est.interval["cost"][1] > est.interval["cost"][0]
    )
    company = est.table.set_index("tool").loc["company"]
    assert (
        company["per"] == "distinct domain"
        and company["paid_calls"] + company["reused_calls"] + company["shared_calls"] == 280
    )
    assert est.no_spread["paid_calls"].startswith("'company' is paid once per distinct domain: ")


def test_calls_with_a_receipt_from_before_the_estimate_are_free_in_the_count(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """Another play looked up the first 100 rows' domains before: the estimate counts only the
    domains left with no receipt (the others reused), and the run pays exactly what it projects."""
    frame = _repeating(300, seed=6)
    company = _company(demo)

    async def look(row: Any, ctx: pb.Context) -> Any:
        return {"name": (await ctx.tool(company, domain=row.domain))["name"]}

    frame.iloc[:100].play.map(pb.play(look, name="look"), store=store, progress=False)
    play = _company_then_llm(demo)
    est = frame.play.estimate(play, sample=20, store=store, progress=False)
    run = frame.play.run(play, store=store, progress=False)
    looked = est.table.set_index("tool").loc["company"]
    assert looked["reused_calls"] > 0 and est.paid_calls == run.stats.calls_executed


def test_a_tool_a_row_also_calls_in_a_sub_play_is_projected_per_row_and_the_run_pays_that(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """Each row looks up its domain, and a sub-play looks up its mail domain: two calls of the
    tool a row, not one per distinct domain; the estimate projects them per row, as the run pays."""
    company = pb.http_tool(
        "company",
        method="GET",
        url=demo.url + "/v1/company",
        params={"domain": "{domain}"},
        headers={"Authorization": "Bearer demo-key"},
        provider=pb.Provider("acme"),
        cost=0.25,
    )

    async def mail(row: Any, ctx: pb.Context) -> Any:
        return {"mail": (await ctx.tool(company, domain=row.domain))["name"]}

    async def both(row: Any, ctx: pb.Context) -> Any:
        found = await ctx.tool(company, domain=row.domain)
        return {"name": found["name"], **(await ctx.run_play(pb.play(mail, name="mail"), domain=row.mail))}

    frame = pd.concat([_frame(50)] * 2, ignore_index=True).assign(
        first=[f"Q{i}" for i in range(100)]
    )  # 50 domains, twice each
    frame["mail"] = "mail." + frame["domain"]
    est = frame.play.estimate(both, sample=20, store=store, progress=False)
    run = frame.play.run(both, store=store, progress=False)
    assert est.table["per"].tolist() == ["row"] and run.stats.calls_executed <= est.paid_calls


def test_a_pilot_whose_rows_pay_different_calls_has_an_interval_of_width_and_no_reason_for_none(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """A waterfall missing half the time on its first leg: pilot rows pay one call or two, so the
    paid calls' and money's intervals have width (no reason given for none), and hold the run's."""
    both = _waterfall(demo)

    frame = _frame(200)
    est = frame.play.estimate(both, sample=20, store=store, progress=False)
    run = frame.play.run(both, store=store, progress=False)
    for name, real in (("paid_calls", run.stats.calls_executed), ("cost", run.stats.cost_spent)):
        low, high = est.interval[name]
        assert low < high and low <= real <= high and name not in est.no_spread
    assert "no spread" not in str(est)


def test_a_pilot_whose_rows_all_pay_alike_says_why_its_interval_has_no_width(
    demo: pb.demo.DemoServer, store: pb.ReceiptStore
) -> None:
    """Every row pays one lookup of its own domain and one email call made from its row (not read
    from a column): the intervals have no width, and the estimate says why."""
    company = pb.http_tool(
        "company",
        method="GET",
        url=demo.url + "/v1/company",
        params={"domain": "{domain}"},
        headers={"Authorization": "Bearer demo-key"},
        provider=pb.Provider("acme"),
        cost=0.25,
    )
    email = pb.demo.email_tool(demo, provider=pb.Provider("acme"), cost=0.5)

    async def both(row: Any, ctx: pb.Context) -> Any:
        await ctx.tool(company, domain=row.domain)
        return {"email": await ctx.tool(email, domain=row.domain, first=row.first.lower())}

    est = _frame(100).play.estimate(both, sample=20, store=store, progress=False)
    assert (est.paid_calls, est.cost, est.interval["paid_calls"], est.interval["cost"]) == (
        160,
        60.0,
        (160.0, 160.0),
        (60.0, 60.0),
    )
    per_row = (
        " (projected per row: the rows left are assumed to share its calls no more than the pilot's rows, which shared none; "
        "an input read from a column is counted per distinct value)"
    )
    assert est.no_spread == {
        "paid_calls": "'company' is paid once per distinct domain: 80 left with no receipt; "
        f"every pilot row paid 1 call of 'demo.email'{per_row}",
        "cost": "'company' is paid once per distinct domain: 80 left with no receipt, at 0.25 each; "
        f"every pilot row paid 1 call of 'demo.email', at 0.5 a row{per_row}",
        "tokens": "no call the pilot paid counted tokens",
    }
    assert f"no spread: {est.no_spread['cost']}" in str(est) and est.to_dict()["no_spread"] == est.no_spread
