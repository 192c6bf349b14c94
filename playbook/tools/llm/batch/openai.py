"""OpenAI's Batch API (``/v1/files``, ``/v1/batches``): the requests uploaded as a JSON Lines file
(the submission's token is the file's id), a batch job made over it, its output and error files
read once it is over.  A batch made over a file whose id was never written down is found by its
file in the list of recent batches."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from playbook.tools.llm.batch.api import Job, Member, Wire, jsonl

if TYPE_CHECKING:
    import httpx

    from playbook.tools.llm.engine import LlmEngine

__all__ = ["FINISHED", "OpenAiBatches"]

# A batch in one of these states will change no more: its output (if any) is final.
FINISHED = frozenset({"completed", "failed", "expired", "cancelled"})
_ENDPOINT = "/v1/chat/completions"


class OpenAiBatches:
    """The Batch API of one LLM tool's endpoint (its engine's ``base_url``, its secret)."""

    api = "openai"
    most_bytes = 190_000_000  # its input file: 200 MB at most
    __slots__ = ("tool", "wire")

    def __init__(self, tool: LlmEngine) -> None:
        self.tool = tool
        self.wire = Wire(tool)

    def __repr__(self) -> str:
        return f"<OpenAiBatches {self.tool.base_url}>"

    def lines(self, members: list[Member]) -> bytes:
        """The input file: one request per member."""
        rows = ({"custom_id": key, "method": "POST", "url": _ENDPOINT, "body": body} for key, body in members)
        return "".join(
            json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows
        ).encode("utf-8")

    async def prepare(self, client: httpx.AsyncClient, members: list[Member]) -> str:
        files = {"file": ("requests.jsonl", self.lines(members), "application/jsonl")}
        doc = await self.wire.json(client, "POST", "/files", files=files, data={"purpose": "batch"})
        return str(doc["id"])

    async def create(self, client: httpx.AsyncClient, token: str, members: list[Member]) -> Job:
        body = {
            "input_file_id": token,
            "endpoint": _ENDPOINT,
            "completion_window": "24h",
            "metadata": {"playbook_tool": self.tool.name},
        }
        return _job(await self.wire.json(client, "POST", "/batches", json=body))

    async def find(self, client: httpx.AsyncClient, token: str, since: float, ids: list[str]) -> str | None:
        """The batch created over the file ``token``, if one was."""
        after: str | None = None
        for _ in range(20):  # the latest thousands of batches: a lost one is recent
            params = {"limit": "100", **({"after": after} if after else {})}
            page = await self.wire.json(client, "GET", "/batches", params=params)
            data = page.get("data") or []
            for batch in data:
                if isinstance(batch, Mapping) and batch.get("input_file_id") == token:
                    return str(batch["id"])
            if not page.get("has_more") or not data:
                return None
            after = str(data[-1].get("id"))
        return None

    async def retrieve(self, client: httpx.AsyncClient, batch_id: str) -> Job:
        return _job(await self.wire.json(client, "GET", f"/batches/{batch_id}"))

    async def results(self, client: httpx.AsyncClient, job: Job) -> dict[str, Any]:
        """``custom_id -> chat completion`` (answered) or ``-> str`` (that request's error)."""
        out: dict[str, Any] = {}
        for field in ("output_file_id", "error_file_id"):
            file_id = job.doc.get(field)
            if file_id:
                for row in jsonl(await self.wire.send(client, "GET", f"/files/{file_id}/content")):
                    _read_line(row, out)
        return out


def _job(doc: dict[str, Any]) -> Job:
    status = str(doc.get("status"))
    created = doc.get("created_at")
    return Job(
        str(doc["id"]),
        status,
        status in FINISHED,
        created if isinstance(created, (int, float)) else None,
        doc,
    )


def _read_line(row: dict[str, Any], out: dict[str, Any]) -> None:
    key = row.get("custom_id")
    if not isinstance(key, str):
        return  # not a result line: nothing answers from it
    response = row.get("response") or {}
    body = response.get("body") if isinstance(response, Mapping) else None
    if isinstance(response, Mapping) and response.get("status_code") == 200 and isinstance(body, Mapping):
        out[key] = dict(body)
        return
    error = row.get("error") or (body.get("error") if isinstance(body, Mapping) else None) or {}
    message = error.get("message") if isinstance(error, Mapping) else str(error)
    status = response.get("status_code") if isinstance(response, Mapping) else None
    out[key] = f"HTTP {status}: {message}" if status else str(message or "no answer")
