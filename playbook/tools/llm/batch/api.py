"""What every provider's batch interface offers an LLM tool in ``mode="batch"``, and the HTTP under
it.

A batch is made in two steps so that a process that dies in between leaves something to find::

    prepare(members)         a token naming the submission, written down before the batch is
                             made (OpenAI: the uploaded input file; the others: a name made here)
    create(token, members)   the batch, made under that token
    find(token, since, ids)  the batch a submission made under ``token`` whose id was never
                             written down: its id, None (never made), or NotYet (can't tell yet)
    retrieve(batch id)       the batch as it stands (a :class:`Job`)
    results(job)             custom id -> the request's answer as the online endpoint gives it,
                             or a string: why that request has none

A member is ``(custom id, request body)``: the body exactly as the online call sends it, so its
answer is read (and its receipt made) as the online call's is.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import httpx

from playbook.addresses import digest
from playbook.errors import ToolError
from playbook.secrets import PLACEHOLDER, SecretAuth, rebuilt, scrub
from playbook.tools.failures import translate

if TYPE_CHECKING:
    from playbook.tools.llm.engine import LlmEngine

__all__ = ["BatchApi", "Job", "Member", "NotYet", "Wire", "custom_id", "jsonl", "new_token", "unix_seconds"]

Member = tuple[str, dict[str, Any]]  # (custom id, request body as the online call sends it)

# What every provider takes as a request's custom id (Anthropic's rule, the strictest).
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def custom_id(address: str) -> str:
    """A receipt address as a request's custom id: itself when it fits every provider's rule
    (it does: a letter and 32 hex digits), else a digest of it.  A function of the address alone:
    a process that never saw the submission maps it the same way."""
    return address if _CUSTOM_ID.match(address) else "k" + digest(address)


def new_token() -> str:
    """A name for one submission, never given to another (the same calls submitted again after
    their batch expired get a new one): what a lost batch is found by."""
    return "playbook-" + uuid.uuid4().hex


class Job(NamedTuple):
    """A batch as last retrieved: its id, its status in the provider's words, whether it will
    change no more, when it was made (Unix seconds, when said) and the provider's document."""

    id: str
    status: str
    finished: bool
    created: float | None
    doc: dict[str, Any]


class NotYet(Exception):
    """A lost submission's batch cannot be told apart from others until they end."""


class BatchApi(Protocol):
    """One provider's batch interface, for one LLM tool (see the module docstring)."""

    @property
    def api(self) -> str: ...
    @property
    def most_bytes(self) -> int:
        """The most one batch's requests may weigh, JSON-encoded."""
        ...

    async def prepare(self, client: httpx.AsyncClient, members: list[Member]) -> str: ...
    async def create(self, client: httpx.AsyncClient, token: str, members: list[Member]) -> Job: ...
    async def find(
        self, client: httpx.AsyncClient, token: str, since: float, ids: list[str]
    ) -> str | None: ...
    async def retrieve(self, client: httpx.AsyncClient, batch_id: str) -> Job: ...
    async def results(self, client: httpx.AsyncClient, job: Job) -> dict[str, Any]: ...


class Wire:
    """Requests to one tool's provider with its key where its dialect puts it (and the headers
    the dialect's API requires), errors classified as HTTP answers are (a 429 or a 5xx retried by
    the provider's governor, a 401 stops the run)."""

    __slots__ = ("tool", "templates")

    def __init__(self, tool: LlmEngine) -> None:
        self.tool = tool
        self.templates = tool.dialect.headers(tool.endpoint.secret is not None)  # "{secret}": the key

    def __repr__(self) -> str:
        return f"<Wire {self.tool.base_url}>"

    def _fill(self, request: httpx.Request, value: str) -> httpx.Request:
        keyed = {k: v.replace("{secret}", value) for k, v in self.templates.items() if "{secret}" in v}
        return rebuilt(request, headers=keyed)

    async def json(self, client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        """The answer to a request as a JSON object (``url``: a path under the tool's base URL, or
        a whole URL the provider gave)."""
        content = await self.send(client, method, url, **kwargs)
        name = self.tool.name
        try:
            doc = json.loads(content)
        except ValueError:
            raise ToolError(f"llm tool {name!r}: {method} {url} answered malformed JSON", tool=name) from None
        if not isinstance(doc, dict):
            raise ToolError(
                f"llm tool {name!r}: {method} {url} answered {type(doc).__name__}, not an object", tool=name
            )
        return scrub(doc)  # type: ignore[no-any-return]

    async def send(self, client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> bytes:
        tool = self.tool
        secret = tool.endpoint.secret
        auth = SecretAuth(secret, self._fill) if secret is not None else httpx.USE_CLIENT_DEFAULT
        headers = {k: v.replace("{secret}", PLACEHOLDER) for k, v in self.templates.items()}
        try:
            params = {**tool.query, **kwargs.pop("params", {})}
            resp = await client.request(
                method,
                url if url.startswith(("http://", "https://")) else tool.base_url + url,
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


def jsonl(content: bytes) -> list[dict[str, Any]]:
    """The objects of a JSON Lines file (lines that are not one skipped: nothing answers from them)."""
    out = []
    for line in content.decode("utf-8", "replace").splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def unix_seconds(stamp: Any) -> float | None:
    """An RFC 3339 time (``2024-09-24T18:37:24.100435Z``) as Unix seconds (None: not one)."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
