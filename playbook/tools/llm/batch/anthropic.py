"""Anthropic's Message Batches (``/v1/messages/batches``): one request making the batch, each member
``{"custom_id", "params"}`` with ``params`` the Messages request body; ``processing_status``
``in_progress`` / ``canceling`` / ``ended``; once ended, its ``results_url`` a JSON Lines file of
``{"custom_id", "result": {"type": succeeded | errored | canceled | expired, ...}}``.

A batch carries no name of ours, so one whose id was never written down (its submitter died
between making it and writing it down) is found by its custom ids: among the batches made since
the submission began, the one whose results hold them.  Until every such batch has ended that
cannot be told (:class:`NotYet`), and nothing is submitted again meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from playbook.tools.llm.batch.api import Job, Member, NotYet, Wire, jsonl, new_token, unix_seconds

if TYPE_CHECKING:
    import httpx

    from playbook.tools.llm.engine import LlmEngine

__all__ = ["VERSION", "AnthropicBatches"]

VERSION = "2023-06-01"  # the anthropic-version header every request carries
_PATH = "/v1/messages/batches"
_SLACK = 60.0  # seconds between the provider's clock and ours that a batch's creation may differ by


class AnthropicBatches:
    """The Message Batches of one LLM tool's endpoint (its ``base_url``, its key in ``x-api-key``)."""

    api = "anthropic"
    most_bytes = 250_000_000  # a Message Batch: 256 MB at most
    __slots__ = ("tool", "wire")

    def __init__(self, tool: LlmEngine) -> None:
        self.tool = tool
        self.wire = Wire(tool)

    def __repr__(self) -> str:
        return f"<AnthropicBatches {self.tool.base_url}>"

    async def prepare(self, client: httpx.AsyncClient, members: list[Member]) -> str:
        return new_token()

    async def create(self, client: httpx.AsyncClient, token: str, members: list[Member]) -> Job:
        requests = [{"custom_id": key, "params": body} for key, body in members]
        return _job(await self.wire.json(client, "POST", _PATH, json={"requests": requests}))

    async def find(self, client: httpx.AsyncClient, token: str, since: float, ids: list[str]) -> str | None:
        wanted, waiting = set(ids), False
        after: str | None = None
        for _ in range(20):  # newest first: the lost batch is among the latest
            params = {"limit": "100", **({"after_id": after} if after else {})}
            page = await self.wire.json(client, "GET", _PATH, params=params)
            data = [_job(dict(doc)) for doc in page.get("data") or [] if isinstance(doc, Mapping)]
            for job in data:
                if job.created is not None and job.created < since - _SLACK:
                    return _nothing(waiting)
                if not job.finished:
                    waiting = True  # it may be ours: its results will say
                elif wanted & set(await self.results(client, job)):
                    return job.id
            if not page.get("has_more") or not data:
                break
            after = data[-1].id
        return _nothing(waiting)

    async def retrieve(self, client: httpx.AsyncClient, batch_id: str) -> Job:
        return _job(await self.wire.json(client, "GET", f"{_PATH}/{batch_id}"))

    async def results(self, client: httpx.AsyncClient, job: Job) -> dict[str, Any]:
        """``custom_id -> Message`` (succeeded) or ``-> str`` (errored, canceled, expired)."""
        url = job.doc.get("results_url") or f"{_PATH}/{job.id}/results"
        out: dict[str, Any] = {}
        for row in jsonl(await self.wire.send(client, "GET", str(url))):
            key, result = row.get("custom_id"), row.get("result")
            if isinstance(key, str) and isinstance(result, Mapping):
                out[key] = _answer(result)
        return out


def _nothing(waiting: bool) -> str | None:
    """None: no batch holds the submission; while one that may hold it is still in progress, NotYet."""
    if waiting:
        raise NotYet("a batch made since this submission began is still in progress: it may be this one")
    return None


def _answer(result: Mapping[str, Any]) -> dict[str, Any] | str:
    kind = result.get("type")
    message = result.get("message")
    if kind == "succeeded" and isinstance(message, Mapping):
        return dict(message)
    if kind == "errored":
        error = result.get("error")
        inner = error.get("error") if isinstance(error, Mapping) else None
        detail = inner if isinstance(inner, Mapping) else error if isinstance(error, Mapping) else {}
        return f"errored: {detail.get('type', 'error')}: {detail.get('message', 'no message')}"
    if kind == "expired":
        return "expired: the batch reached its 24 hours before this request was answered"
    if kind == "canceled":
        return "canceled: the batch was canceled before this request was answered"
    return f"no answer (result {kind!r})"


def _job(doc: dict[str, Any]) -> Job:
    status = str(doc.get("processing_status"))
    return Job(str(doc["id"]), status, status == "ended", unix_seconds(doc.get("created_at")), doc)
