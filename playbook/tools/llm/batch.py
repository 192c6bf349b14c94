"""OpenAI's Batch API (``/v1/files``, ``/v1/batches``) as an LLM tool in ``mode="batch"`` uses it:
upload the requests as a JSON Lines file, create a batch job over it, follow the job, read its
output and error files.  Each request's ``custom_id`` is its receipt address, so an answer finds
its receipt whichever process submitted it.

Errors are classified as HTTP answers are (a 429 or a 5xx is retried by the provider's governor,
a 401 stops the run), with the tool named.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from playbook.errors import ToolError
from playbook.secrets import PLACEHOLDER, SecretAuth, bearer, scrub
from playbook.tools.failures import translate

if TYPE_CHECKING:
    from playbook.tools.llm.engine import LlmEngine

__all__ = ["FINISHED", "BatchApi"]

# A batch in one of these states will change no more: its output (if any) is final.
FINISHED = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchApi:
    """The Batch API of one LLM tool's endpoint (its engine's ``base_url``, its secret)."""

    __slots__ = ("tool",)

    def __init__(self, tool: LlmEngine) -> None:
        self.tool = tool

    def __repr__(self) -> str:
        return f"<BatchApi {self.tool.base_url}>"

    def lines(self, members: list[tuple[str, list[dict[str, Any]]]]) -> bytes:
        """The input file: one request per ``(receipt address, messages)``."""
        rows = (
            {
                "custom_id": key,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": self.tool.body(messages),
            }
            for key, messages in members
        )
        return "".join(
            json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows
        ).encode("utf-8")

    async def upload(self, client: httpx.AsyncClient, content: bytes) -> str:
        files = {"file": ("requests.jsonl", content, "application/jsonl")}
        doc = await self._json(client, "POST", "/files", files=files, data={"purpose": "batch"})
        return str(doc["id"])

    async def create(self, client: httpx.AsyncClient, file_id: str) -> dict[str, Any]:
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"playbook_tool": self.tool.name},
        }
        return await self._json(client, "POST", "/batches", json=body)

    async def find(self, client: httpx.AsyncClient, file_id: str) -> dict[str, Any] | None:
        """The batch created over ``file_id``, if one was (its creation may have been cut short
        before its id was written down)."""
        after: str | None = None
        for _ in range(20):  # the latest thousands of batches: a lost one is recent
            params = {"limit": "100", **({"after": after} if after else {})}
            page = await self._json(client, "GET", "/batches", params=params)
            data = page.get("data") or []
            for batch in data:
                if isinstance(batch, Mapping) and batch.get("input_file_id") == file_id:
                    return dict(batch)
            if not page.get("has_more") or not data:
                return None
            after = str(data[-1].get("id"))
        return None

    async def retrieve(self, client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
        return await self._json(client, "GET", f"/batches/{batch_id}")

    async def results(self, client: httpx.AsyncClient, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``custom_id -> chat completion`` (answered) or ``-> str`` (that request's error)."""
        out: dict[str, Any] = {}
        for field in ("output_file_id", "error_file_id"):
            file_id = batch.get(field)
            if not file_id:
                continue
            content = await self._send(client, "GET", f"/files/{file_id}/content")
            for line in content.decode("utf-8", "replace").splitlines():
                if line.strip():
                    _read_line(line, out)
        return out

    async def _json(self, client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        content = await self._send(client, method, path, **kwargs)
        try:
            doc = json.loads(content)
        except ValueError:
            raise ToolError(
                f"llm tool {self.tool.name!r}: {method} {path} answered malformed JSON", tool=self.tool.name
            ) from None
        if not isinstance(doc, dict):
            raise ToolError(
                f"llm tool {self.tool.name!r}: {method} {path} answered {type(doc).__name__}, not an object",
                tool=self.tool.name,
            )
        return scrub(doc)  # type: ignore[no-any-return]

    async def _send(self, client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> bytes:
        tool = self.tool
        secret = tool.endpoint.secret
        auth = SecretAuth(secret, bearer) if secret is not None else httpx.USE_CLIENT_DEFAULT
        headers = {"Authorization": f"Bearer {PLACEHOLDER}"} if secret is not None else {}
        try:
            params = {**tool.query, **kwargs.pop("params", {})}
            resp = await client.request(
                method,
                tool.base_url + path,
                params=params,
                auth=auth,
                headers=headers,
                timeout=tool.endpoint.timeout,
                **kwargs,
            )
            content = await resp.aread()
            resp.raise_for_status()
        except Exception as exc:
            provider = tool.provider.name if tool.provider is not None else None
            error = translate(exc, tool=tool.name, provider=provider)
            if error is None:
                raise
            raise error from None
        return content


def _read_line(line: str, out: dict[str, Any]) -> None:
    try:
        row = json.loads(line)
        key = row["custom_id"]
    except (ValueError, KeyError, TypeError):
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
