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


# The dialects an LLM tool speaks, and where each sends its key (the demo counts where keys came).
DIALECTS = ("openai", "openai-responses", "anthropic", "gemini", "azure", "bedrock")
KEY_PLACES = {
    "openai": "header authorization",
    "openai-responses": "header authorization",
    "anthropic": "header x-api-key",
    "gemini": "header x-goog-api-key",
    "azure": "header api-key",
    # SigV4: the access key id goes in the signature's Credential, the secret access key never
    "bedrock": "header authorization",
}
LLM_KEY = "PLAYBOOK_TEST_LLM_KEY"


def dialect_tool(demo: Any, api: str, tool: str, **options: Any) -> pb.Tool:
    """An LLM tool speaking ``api`` to the demo, its key read from ``LLM_KEY`` (bedrock: from the
    AWS credential chain, the environment's ``AWS_ACCESS_KEY_ID``: see ``aws_env``)."""
    base = demo.url + "/v1" if api in ("openai", "openai-responses") else demo.url
    where: dict[str, Any] = {"region": "us-east-1"} if api == "bedrock" else {"secret": pb.secret(LLM_KEY)}
    if api == "azure":
        where["api_version"] = "2024-10-21"
    return pb.llm_tool(tool, api=api, model="demo-mini", base_url=base, **where, **options)


def aws_env(demo_key: str) -> dict[str, str]:
    """What the AWS credential chain reads first: the demo's key as the access key id (the demo
    checks the signature's shape, not its value), and no profile or instance metadata to ask."""
    return {
        "AWS_ACCESS_KEY_ID": demo_key,
        "AWS_SECRET_ACCESS_KEY": "demo-secret-access-key",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
