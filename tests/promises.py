"""What the promise tests (``test_promises_*``) build their plays from: frames of people, an
enrichment play over one tool, the demo's email tool, and what the demo provider counted."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pydantic

import playbook as pb


def verdict_model() -> type[pydantic.BaseModel]:
    """An LLM answer's fields (the demo fills them from the prompt); made in a function, so it
    travels to other processes with the play, as a model in a user's notebook does."""

    class Verdict(pydantic.BaseModel):
        industry: str
        summary: str

    return Verdict


def people(n: int, calls: int | None = None) -> pd.DataFrame:
    """``n`` rows; with ``calls``, only that many different calls among them (rows i and
    i + calls look up the same person)."""
    k = calls or n
    return pd.DataFrame(
        {
            "n": range(n),
            "domain": [f"company{i % k}.com" for i in range(n)],
            "first": [f"P{i % k}" for i in range(n)],
        }
    )


def enrich(tool: pb.Tool) -> pb.Play:
    async def play(row, ctx):  # type: ignore[no-untyped-def]
        return {"email": await ctx.tool(tool, domain=row.domain, first=row.first)}

    return pb.play(play, name="enrich")


def email(demo: pb.demo.DemoServer, provider: pb.Provider, **options: Any) -> pb.Tool:
    return pb.demo.email_tool(demo, provider=provider, **options)


def requests(demo: pb.demo.DemoServer) -> int:
    return int(demo.stats()["requests"])


def answered(demo: pb.demo.DemoServer) -> int:
    """Requests the provider answered (every status but 429: a refusal is not paid)."""
    stats = demo.stats()
    return int(stats["requests"] - stats["by_status"].get("429", 0))
