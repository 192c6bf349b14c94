"""A run as static HTML: counters, providers, parked rows, grouped errors, waterfalls; capped and escaped."""

from __future__ import annotations

import asyncio
import re

import pandas as pd
from vtime import run_virtual

import playbook as pb
from playbook.ui.html import LIMIT


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
        first = await ctx.waterfall("email", [ctx.call(primary, n=row.n), ctx.call(backup, n=row.n)])
        return {"first": first, "again": await ctx.tool(primary, n=row.n + 1000)}

    async def main() -> pb.Run:
        run = await pd.DataFrame({"n": range(40)}).play.arun(both, store=store, progress=False, background=True, concurrency=1)
        await asyncio.wait([run._task])
        return run

    run = run_virtual(main())
    html = run._repr_html_()
    s = run.stats
    assert _cells(html, "rows") == [[str(s.total), str(s.ok), "0", str(s.failed), "0", str(s.parked), "0", str(s.calls_executed), "0", "0", "0"]]
    assert s.parked > LIMIT and s.failed == 4
    providers = _cells(html, "provider")
    assert providers[0][0] == "quota" and providers[0][1].startswith("held until ") and providers[0][4] != "0"
    assert providers[0][5] == str(s.parked)
    assert len(_cells(html, "row")) == LIMIT and f"… and {s.parked - LIMIT:,} more" in html
    errors = _cells(html, "rows</th><th>error")
    assert errors[0][0] == "4" and "&lt;script&gt;" in errors[0][1] and "<script>" not in html
    legs = _cells(html, "waterfall")
    assert [leg[2] for leg in legs] == ["primary", "backup"]
