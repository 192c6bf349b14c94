"""A run as static HTML: counters, providers (held, or down since when and why), parked rows, grouped
errors, waterfalls; capped and escaped."""

from __future__ import annotations

import asyncio
import re
import time

import pandas as pd
from provider_state import set_down
from vtime import run_virtual

import playbook as pb
from playbook._internal.words import time_of_day
from playbook.events import ProviderDown
from playbook.runtime.state.reading import provider_view
from playbook.ui.html import LIMIT, providers_table


def _cells(html: str, header: str) -> list[list[str]]:
    """The body rows of the table whose first header is ``header``."""
    table = re.search(rf"<table><thead><tr><th>{header}</th>.*?</table>", html, re.S)
    assert table, f"no table headed {header!r}"
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table.group(0))[1:]]


def test_html_shows_counters_providers_parked_rows_errors_and_legs(store: pb.ReceiptStore) -> None:
    """The summary holds the run's counts, the held provider, capped parked rows, grouped errors and leg stats."""
    quota = pb.Provider("quota", max_wait=60)
    answered: list[int] = []

    @pb.tool(provider=quota)
    async def primary(n: int) -> str:
        if len(answered) >= 3:
            raise pb.ToolError("daily quota exceeded", status=429, retry_after=3600)
        answered.append(n)
        return f"p{n}"

    @pb.tool
    async def backup(n: int) -> str:
        if n % 10 == 9:
            raise ValueError("<script>alert(1)</script> no luck")
        return f"b{n}"

    @pb.play
    async def both(row, ctx):
        first = await ctx.waterfall("email", [ctx.leg(primary, n=row.n), ctx.leg(backup, n=row.n)])
        return {"first": first, "again": await ctx.tool(primary, n=row.n + 1000)}

    async def main() -> pb.Run:
        run = await pd.DataFrame({"n": range(40)}).play.arun(
            both, store=store, progress=False, background=True, concurrency=1
        )
        await asyncio.wait([run._task])
        return run

    run = run_virtual(main())
    html = run._repr_html_()
    s = run.stats
    assert (
        s.calls_executed and s.calls_local
    )  # primary's calls are paid (a provider), backup's local (a plain Python tool)
    assert _cells(html, "rows") == [
        [
            str(s.total),
            str(s.ok),
            "0",
            str(s.failed),
            "0",
            str(s.parked),
            "0",
            str(s.calls_executed),
            str(s.calls_failed),
            "0",
            "0",
            str(s.calls_local),
            "$0.00",
            "$0.00",
            "$0.00",
        ]
    ]
    assert s.parked > LIMIT and s.failed == 4
    providers = _cells(html, "provider")
    assert providers[0][0] == "quota" and providers[0][1].startswith("held until ") and providers[0][4] != "0"
    assert providers[0][5] == str(s.parked)
    # One line says it all: the parked rows wait on quota's hold, until one time (HTTP 429).  They
    # parked over some milliseconds: one line per minute they are ready in (two if one began then).
    minutes = run.parked.groupby(run.parked["ready_at"].dt.floor("min"))["ready_at"].agg(["size", "max"])
    assert 1 <= len(minutes) <= 2 and minutes["size"].sum() == s.parked
    assert sorted(_cells(html, "rows</th><th>why")) == sorted(
        [str(n), "held past the wait budget", "quota", f"{time_of_day(last.timestamp())} (HTTP 429)"]
        for n, last in minutes.itertuples(index=False)
    )
    errors = _cells(html, "rows</th><th>error")
    assert (
        errors[0][0] == "4"
        and errors[0][1].startswith("ValueError: &lt;script&gt;alert(&lt;n&gt;)")
        and "<script>" not in html
    )
    assert errors[0][3].startswith("ValueError: &lt;script&gt;alert(1)")  # the example row's own message
    legs = _cells(html, "waterfall")
    assert [leg[2] for leg in legs] == ["primary", "backup"]


def test_a_down_provider_shows_since_when_why_its_parked_rows_and_the_next_probe(
    store: pb.ReceiptStore,
) -> None:
    """Rows parked on a down provider: the summary says it is down since when and why, its rate with the calls in
    flight it allows, the rows parked "down" and the next probe (a countdown live); run.waiting_on lists it as down."""
    acme = pb.Provider("acme", rps=10, concurrency=4, max_wait=60)
    probe = time.time() + 30

    @pb.tool(provider=acme)
    async def lookup(n: int) -> int:
        if n % 2:  # what the governor raises for a call to a down provider
            raise pb.ProviderExhausted(
                "provider 'acme' is down", provider="acme", tool="lookup", retry_at=probe, reason="down"
            )
        return n

    run = pd.DataFrame({"n": range(6)}).play.run(lookup, store=store, progress=False)
    set_down(acme, "ConnectError: connection refused\n(a traceback would go here)", probe)
    run.state.emit(ProviderDown("acme", "ConnectError: connection refused"))
    since = time_of_day(run.state.down_since["acme"])
    html = run._repr_html_()
    [provider] = _cells(html, "provider")
    assert provider[:2] == [
        "acme",
        f"down since {since}: ConnectError: connection refused; next probe at {time_of_day(probe)}",
    ]
    assert provider[2].endswith("/s, ≤4 in flight") and provider[5] == "3"
    assert _cells(html, "rows</th><th>why") == [
        ["3", "provider down", "acme", f"next probe {time_of_day(probe)}"]
    ]
    assert run.parked["reason"].tolist() == ["down"] * 3

    [down] = run.waiting_on
    assert (down.provider, down.reason, down.until, down.waiting_rows, down.parked_rows) == (
        "acme",
        "down",
        probe,
        3,
        3,
    )
    assert (
        str(down)
        == f"acme: down (ConnectError: connection refused), next probe at {time_of_day(probe)}, 3 rows waiting (3 parked)"
    )

    live = providers_table(
        {"acme": provider_view(acme)}, {"acme": 3}, now=probe - 12, down_since=run.state.down_since
    )
    assert f"next probe in 12s, at {time_of_day(probe)}" in live
    set_down(acme, None)  # up again: its parked rows wait for a retry
    assert _cells(providers_table({"acme": provider_view(acme)}, {}), "provider")[0][1] == "open"
    assert [str(h) for h in run.waiting_on] == ["acme: no hold now, 3 rows waiting (3 parked)"]
