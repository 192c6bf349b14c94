"""Gemini's batch mode (``models/{model}:batchGenerateContent``): the requests inlined, each
``{"request": GenerateContentRequest, "metadata": {"key": custom id}}``, in a batch whose
``displayName`` is the submission's token; the batch is a long-running operation
(``batches/{id}``) whose ``metadata.state`` goes ``BATCH_STATE_PENDING`` / ``_RUNNING`` to
``_SUCCEEDED``, ``_FAILED``, ``_CANCELLED`` or ``_EXPIRED`` (the SDK spells them ``JOB_STATE_*``:
both are read), and whose ``response.inlinedResponses.inlinedResponses`` (or the batch's
``metadata.output``) answer in order, each with its request's metadata, a ``response`` or an
``error``.

A batch whose id was never written down is found by its display name in the list of batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from playbook.tools.llm.batch.api import Job, Member, Wire, new_token, unix_seconds

if TYPE_CHECKING:
    import httpx

    from playbook.tools.llm.engine import LlmEngine

__all__ = ["GeminiBatches", "position"]

_ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"})


def position(index: int) -> str:
    """The key of an answer that came back without its request's metadata: its place in the batch."""
    return f"#{index}"


class GeminiBatches:
    """The batch mode of one LLM tool's endpoint (its ``base_url``, its key in ``x-goog-api-key``)."""

    api = "gemini"
    most_bytes = 19_000_000  # inlined requests: 20 MB at most in all
    __slots__ = ("tool", "wire")

    def __init__(self, tool: LlmEngine) -> None:
        self.tool = tool
        self.wire = Wire(tool)

    def __repr__(self) -> str:
        return f"<GeminiBatches {self.tool.base_url}>"

    async def prepare(self, client: httpx.AsyncClient, members: list[Member]) -> str:
        return new_token()

    async def create(self, client: httpx.AsyncClient, token: str, members: list[Member]) -> Job:
        model = self.tool.model.removeprefix("models/")
        requests = [{"request": body, "metadata": {"key": key}} for key, body in members]
        batch = {
            "displayName": token,
            "model": f"models/{model}",
            "inputConfig": {"requests": {"requests": requests}},
        }
        url = f"/v1beta/models/{model}:batchGenerateContent"
        return _job(await self.wire.json(client, "POST", url, json={"batch": batch}))

    async def find(self, client: httpx.AsyncClient, token: str, since: float, ids: list[str]) -> str | None:
        page_token: str | None = None
        for _ in range(20):
            params = {"pageSize": "100", **({"pageToken": page_token} if page_token else {})}
            page = await self.wire.json(client, "GET", "/v1beta/batches", params=params)
            for doc in page.get("operations") or page.get("batches") or []:
                if isinstance(doc, Mapping) and _metadata(doc).get("displayName") == token:
                    return str(doc.get("name"))
            page_token = page.get("nextPageToken")
            if not page_token:
                return None
        return None

    async def retrieve(self, client: httpx.AsyncClient, batch_id: str) -> Job:
        return _job(await self.wire.json(client, "GET", f"/v1beta/{batch_id}"))

    async def results(self, client: httpx.AsyncClient, job: Job) -> dict[str, Any]:
        """``key -> GenerateContentResponse`` or ``-> str`` (that request's error); an answer
        without its metadata under its place (:func:`position`)."""
        response = job.doc.get("response")
        if not isinstance(response, Mapping):  # the batch's own output, where the operation has none
            response = _metadata(job.doc).get("output")
        holder = response.get("inlinedResponses") if isinstance(response, Mapping) else None
        inlined = holder.get("inlinedResponses") if isinstance(holder, Mapping) else holder
        out: dict[str, Any] = {}
        for i, item in enumerate(inlined if isinstance(inlined, list) else []):
            if not isinstance(item, Mapping):
                continue
            meta = item.get("metadata")
            key = meta.get("key") if isinstance(meta, Mapping) else None
            answer, error = item.get("response"), item.get("error")
            if isinstance(answer, Mapping) and not error:
                got: Any = dict(answer)
            else:
                detail = error if isinstance(error, Mapping) else {}
                got = f"HTTP {detail.get('code', '?')} {detail.get('status', '')}: {detail.get('message', 'no answer')}"
            out[key if isinstance(key, str) else position(i)] = got
        return out


def _metadata(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = doc.get("metadata")
    return meta if isinstance(meta, Mapping) else doc  # a listed batch may come bare


def _job(doc: dict[str, Any]) -> Job:
    meta = _metadata(doc)
    state = str(meta.get("state") or doc.get("state") or "BATCH_STATE_PENDING")
    ended = state.removeprefix("BATCH_STATE_").removeprefix("JOB_STATE_") in _ENDED
    name = doc.get("name") or meta.get("name")
    return Job(str(name), state, ended or doc.get("done") is True, unix_seconds(meta.get("createTime")), doc)
