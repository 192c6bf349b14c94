"""A key goes only where its tool's definition puts it: no row value, however crafted, makes a
tool send it anywhere else, and an answer that echoes a part of it is kept masked.

Each promise runs on every engine (one process, processes sharing Redis, a Dask cluster) against
the demo provider, which counts each place a request carried one of its keys (``key_places``).
The rows carry what a scraped or pasted value could: the stand-in a tool renders in place of its
key, ``{secret}`` spelled out, and the key's own first characters, in every template position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
from engines import Engine

import playbook as pb
from playbook.secrets import PART, PLACEHOLDER

# Letters and digits only, so the demo's answers (made of the prompt's words) can echo it whole.
KEY = "pbLive7Qx2Zm9Wq4Rt8NsKe3Vy"
ENV = "PLAYBOOK_TEST_HOSTILE_KEY"
PAYLOADS = (
    PLACEHOLDER,
    f"x{PLACEHOLDER}y",
    "{secret}",
    "Bearer {secret}",
    "{{secret}}",
    KEY[:12],
    f"{PLACEHOLDER} {{secret}} {KEY[:10]}",
)


def _hostile(n: int = len(PAYLOADS)) -> pd.DataFrame:
    values = [PAYLOADS[i % len(PAYLOADS)] for i in range(n)]
    return pd.DataFrame(
        {"seg": values, "q": values, "note": values, "text": [f"{v} #{i}" for i, v in enumerate(values)]}
    )


def _parts(text: str) -> list[str]:
    """The runs of ``PART`` characters of the key that ``text`` holds."""
    return [KEY[i : i + PART] for i in range(len(KEY) - PART + 1) if KEY[i : i + PART] in text]


@pytest.fixture
def keyed(engine: Engine, demo: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider accepting only KEY, and every process of the engine holding it."""
    demo.reset(api_keys=(KEY,), miss_rate=0)
    engine.setenv(ENV, KEY)
    return demo


def test_a_row_value_never_puts_the_key_anywhere_but_where_the_tool_puts_it(
    engine: Engine, keyed: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """An http_tool with its key in the Authorization header, and rows whose path segment, query,
    custom header and JSON body hold the stand-in, ``{secret}`` and the key's prefix: each request
    carries the key in that header alone, and the provider sees the rows' text as it was."""
    tool = pb.http_tool(
        name("echo"),
        provider=pb.Provider(name("acme"), concurrency=4),
        method="POST",
        url=keyed.url + "/v1/echo/{seg}",
        params={"q": "{q}"},
        json={"text": "{text}", "more": ["{q}", {"n": "{note}"}]},
        headers={"Authorization": "Bearer {secret}", "X-Note": "{note}"},
        secret=pb.secret(ENV),
        miss_status=(404,),
    )
    out = engine.run(_hostile(), pb.play(_calling(tool), name=name("hostile")), concurrency=4)
    assert out.statuses == {"ok": len(PAYLOADS)}, (
        out.result["play_error"].dropna().tolist() if out.result is not None else out
    )
    stats = keyed.stats()
    assert stats["by_key"]["…" + KEY[-4:]]["requests"] == len(PAYLOADS)
    assert stats["key_places"] == {"header authorization": len(PAYLOADS)}


def test_a_key_the_tool_puts_in_its_query_and_path_goes_there_and_nowhere_else(
    engine: Engine, keyed: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """A key the definition puts in the query (``?key={secret}``, as Gemini takes it) and in the
    path (as a bot token): the hostile rows put it nowhere else, and the key still goes where the
    definition says, so the provider accepts every request."""
    tool = pb.http_tool(
        name("echo"),
        provider=pb.Provider(name("acme"), concurrency=4),
        method="POST",
        url=keyed.url + "/v1/bot{secret}/{seg}",
        params={"key": "{secret}", "q": "{q}"},
        json={"text": "{text}"},
        headers={"X-Note": "{note}"},
        secret=pb.secret(ENV),
        miss_status=(404,),
    )
    out = engine.run(_hostile(), pb.play(_calling(tool), name=name("hostile")), concurrency=4)
    assert out.statuses == {"ok": len(PAYLOADS)}, (
        out.result["play_error"].dropna().tolist() if out.result is not None else out
    )
    stats = keyed.stats()
    assert stats["by_auth"] == {"ok": len(PAYLOADS), "rejected": 0}
    assert stats["key_places"] == {"path": len(PAYLOADS), "query": len(PAYLOADS)}


def test_an_llm_prompt_or_message_never_carries_the_key_and_an_echoed_part_is_kept_masked(
    engine: Engine, keyed: pb.demo.DemoServer, name: Callable[[str], str]
) -> None:
    """LLM calls whose prompts and messages hold the stand-in, ``{secret}`` and the key's first
    characters: the key goes in the bearer header alone, and an answer that repeats a part of
    the key (the demo's summaries echo the prompt's words) is kept and returned masked."""
    llm = pb.llm_tool(
        name=name("llm"),
        model="gpt-4o-mini",
        base_url=keyed.url + "/v1",
        secret=pb.secret(ENV),
        provider=pb.Provider(name("chat"), concurrency=4),
    )

    async def ask(row: Any, ctx: pb.Context) -> Any:
        said = await ctx.tool(llm, prompt=f"Summarise: the token {row.q} was pasted here")
        told = await ctx.tool(
            llm, messages=[{"role": "system", "content": row.note}, {"role": "user", "content": row.text}]
        )
        return {"said": said, "told": told}

    out = engine.run(_hostile(), pb.play(ask, name=name("ask")), concurrency=4)
    assert out.result is not None and out.statuses == {"ok": len(PAYLOADS)}, (
        out.result["play_error"].dropna().tolist()
    )
    stats = keyed.stats()
    assert stats["key_places"] == {"header authorization": stats["requests"]}
    echoed = out.result["said"][out.result["q"].str.contains(KEY[:PART], regex=False)]
    assert len(echoed) == 2 and all("***" in said for said in echoed), echoed.tolist()
    for value in (*out.result["said"], *out.result["told"]):
        assert not _parts(value), (value, _parts(value))


def _calling(tool: pb.Tool) -> Callable[..., Any]:
    async def play(row: Any, ctx: pb.Context) -> Any:
        return {"answer": await ctx.tool(tool, seg=row.seg, q=row.q, note=row.note, text=row.text)}

    return play
