"""The text view: a tqdm bar on a stream, and a summary that says what holds rows back."""

from __future__ import annotations

import asyncio
import io

import pandas as pd
from vtime import run_virtual

import playbook as pb
from playbook.ui.text import TextView


def test_summary_names_the_provider_that_holds_parked_rows(store: pb.ReceiptStore) -> None:
    """After a quota hold, the text view shows the parked count and which provider holds until when."""
    quota = pb.Provider("quota", max_wait=60)
    answered = []

    @pb.tool(provider=quota)
    async def lookup(n: int) -> int:
        if len(answered) >= 3:
            raise pb.ToolError("daily quota exceeded", status=429, retry_after=3600)
        answered.append(n)
        return n

    out = io.StringIO()

    async def main() -> pb.Run:
        run = await pd.DataFrame({"n": range(8)}).play.arun(lookup, store=store, progress=False, background=True, concurrency=1)
        TextView(run.state, file=out)
        await asyncio.wait([run._task])
        return run

    run = run_virtual(main())
    text = out.getvalue()
    assert run.stats.parked == 5
    assert "ok=3" in text and "parked=5" in text
    summary = text.strip().splitlines()[-2:]
    assert summary[0].startswith("lookup: 8 rows | ok 3 | reused 0 | failed 0 | parked 5")
    assert summary[1].startswith("provider 'quota' holds calls until ") and "(HTTP 429)" in summary[1]


def test_text_view_counts_rows_and_calls(store: pb.ReceiptStore) -> None:
    """The bar reaches the total and the summary counts paid and reused calls."""

    @pb.tool
    async def double(n: int) -> int:
        return 2 * n

    out = io.StringIO()

    async def main() -> None:
        frame = pd.DataFrame({"n": [1, 2, 2, 3]})
        for _ in range(2):
            run = await frame.play.arun(double, store=store, progress=False, background=True)
            TextView(run.state, file=out)
            await asyncio.wait([run._task])

    run_virtual(main())
    lines = out.getvalue().strip().splitlines()
    summaries = [line for line in lines if line.startswith("double: 4 rows")]
    assert summaries[0].startswith("double: 4 rows | ok 4 | reused 0 | failed 0 | calls executed 3, reused 0")
    assert summaries[1].startswith("double: 4 rows | ok 0 | reused 4 | failed 0 | calls executed 0, reused 3")  # the memos saved 3 calls
