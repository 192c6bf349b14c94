"""Batch jobs: the call pipeline's route for an LLM tool in ``mode="batch"``.

A call that misses its receipt is not sent: it joins this run's next submission and its row
sleeps.  Misses gather for ``GATHER`` seconds (rows step aside meanwhile, so every row's miss
joins, not only the rows a worker holds), then go out as one batch job, to the tool's provider's
batch interface (OpenAI's Batch API, Anthropic's Message Batches, Gemini's batch mode: see
:mod:`playbook.tools.llm.batch`).  What was submitted is written down before anything else, one
*job marker* per call (its provider, the submission's token and the call's custom id, then the
batch id), so a kernel restarted during a 24-hour batch finds its calls' batch again and never
submits them twice::

    no marker        join the next submission; sleep
    token, no batch  the batch's creation was cut short: find the batch made under that token
                     (OpenAI: over that file, made now if it never was; the others: a batch that
                     was never made is forgotten, and the call joins the next submission)
    batch            poll it (once per interval for every row waiting on it); sleep until the next poll
    finished         its answer, read by the tool as the online call's is, lands as the call's
                     receipt, marked ``"batch": true`` (a request the batch failed or left
                     unanswered, or a batch that expired, fails its row and clears its marker: the
                     next run submits it again)

Sleeping is durable in the sense that matters: the marker outlives the process, and a row that
wakes in a new run polls the same batch.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from playbook._internal.flow import Sleeping, WaitBudget
from playbook.addresses import job_address
from playbook.errors import ToolError
from playbook.providers.provider import Ticket
from playbook.runtime.state.upstream import dispatch
from playbook.store import MISSING
from playbook.store.records import record
from playbook.tools.llm.batch import BatchApi, Job, Member, NotYet, OpenAiBatches, batches_of, custom_id
from playbook.tools.llm.batch.gemini import position
from playbook.tools.llm.engine import LlmEngine

if TYPE_CHECKING:
    import httpx

    from playbook.store import StoreEngine

__all__ = ["GATHER", "Jobs"]

GATHER = 1.0  # seconds misses gather before they go out as one batch
# requests in one batch: within every provider's limit (OpenAI's 50,000, Anthropic's 100,000)
MOST = 10_000
_LOST = 60.0  # seconds between looks for a lost submission's batch that cannot be told apart yet
T = TypeVar("T")


class Costs(Protocol):
    async def reserve(self, tool: LlmEngine, cost: float | None, *, wait: bool = True) -> None: ...
    def refund(self, cost: float | None) -> None: ...


class RunScope(Protocol):
    """What jobs use of the run (a :class:`~playbook.runtime.calls.scope.RunScope`)."""

    @property
    def store(self) -> StoreEngine: ...
    @property
    def costs(self) -> Costs: ...
    def clock(self) -> float: ...
    def http_client(self) -> httpx.AsyncClient: ...


class Jobs:
    """The batch jobs of one run: submissions gathering, batches polled, results read."""

    __slots__ = (
        "_gathering",
        "_submitting",
        "_failed",
        "_adopting",
        "_polls",
        "_results",
        "reserved",
        "_track",
    )

    def __init__(self, track: Callable[[asyncio.Task[Any]], None]) -> None:
        self._gathering: dict[str, list[tuple[str, Any]]] = {}  # tool -> (address, the call's values)
        self._submitting: set[str] = set()  # addresses joined and not yet written down (their leases held)
        self._failed: dict[str, BaseException] = {}  # address -> why its submission failed
        self._adopting: dict[str, asyncio.Future[str | None]] = {}  # token -> its batch id, being found
        self._polls: dict[str, tuple[float, asyncio.Future[Job]]] = {}  # batch id -> (when, batch)
        self._results: dict[str, asyncio.Future[dict[str, Any]]] = {}  # batch id -> custom id -> answer
        self.reserved: dict[str, float | None] = {}  # address -> cost reserved at submission
        self._track = track  # a stop waits for submissions under way

    def __repr__(self) -> str:
        waiting = sum(len(m) for m in self._gathering.values())
        return f"<Jobs gathering={waiting} batches={len(self._polls)}>"

    async def answer(self, scope: RunScope, tool: LlmEngine, key: str, values: Any) -> dict[str, Any]:
        """The call's answer from its batch, or Sleeping until there may be one."""
        failed = self._failed.pop(key, None)
        if failed is not None:
            raise failed
        api = batches_of(tool)
        mark = job_address(key)
        found = await scope.store.alookup(mark)
        job = _marker(found.value if found is not MISSING else None, api.api)
        if job is None:
            await self._join(scope, tool, key, values)
            raise _sleep(GATHER + 0.5)
        batch_id = job.get("batch") or await self._adopted(scope, tool, api, key, job)
        batch, polled = await self._poll(scope, tool, api, batch_id)
        if not batch.finished:
            raise _sleep(polled + _interval(batch) - asyncio.get_running_loop().time())
        results = await self._read(scope, tool, api, batch)
        got = results.get(str(job.get("id") or key))
        if got is None and isinstance(job.get("n"), int):
            got = results.get(position(job["n"]))
        if isinstance(got, dict):
            # answered by a batch job: priced at the batch price, replayed or not
            return {**tool.dialect.reply(tool.name, got, tool.model), "batch": True}
        await scope.store.commit(record(mark, tool=tool.name, stored=None, tagged=False, at=scope.clock()))
        why = got if isinstance(got, str) else f"the batch ended {batch.status} without an answer to it"
        raise ToolError(
            f"llm tool {tool.name!r}: batch {batch_id}: {why} (the next run submits it again)", tool=tool.name
        )

    # -- submitting ----------------------------------------------------------------------------

    async def _join(self, scope: RunScope, tool: LlmEngine, key: str, values: Any) -> None:
        """Join the next submission, unless this call is in one under way, here (another row
        asking it: claimed before anything is awaited) or in another process (which holds its
        lease until its batch is written down)."""
        if key in self._submitting:
            return  # its row woke before its submission was written down (a slow upload)
        self._submitting.add(key)
        joined = False
        try:
            joined = await self._joined(scope, tool, key, values)
        finally:
            if not joined:
                self._submitting.discard(key)

    async def _joined(self, scope: RunScope, tool: LlmEngine, key: str, values: Any) -> bool:
        leases = scope.store.leases
        if not await leases.take(key):
            return False  # another process is submitting it: its marker will say where
        found = await scope.store.alookup(job_address(key))
        if found is not MISSING and isinstance(found.value, dict):
            leases.release(key)  # submitted and written down between our look and our lease
            return False
        cost = tool.price(values)
        try:
            # a batch may take hours to settle: no waiting on it
            await scope.costs.reserve(tool, cost, wait=False)
        except BaseException:
            leases.release(key)
            raise
        self.reserved[key] = cost
        members = self._gathering.get(tool.name)
        if members is None:
            members = self._gathering[tool.name] = []
            loop = asyncio.get_running_loop()
            loop.call_later(GATHER, lambda: self._track(loop.create_task(self._submit(scope, tool))))
        members.append((key, values))
        return True

    async def _submit(self, scope: RunScope, tool: LlmEngine) -> None:
        api = batches_of(tool)
        for chunk in _chunks(api, tool, self._gathering.pop(tool.name, [])):
            try:
                await self._submit_one(scope, tool, api, chunk)
            except BaseException as exc:
                for key, _ in chunk:
                    self._failed[key] = exc
                    scope.costs.refund(self.reserved.pop(key, 0.0))
                if not isinstance(exc, Exception):
                    raise
            finally:
                for key, _ in chunk:
                    self._submitting.discard(key)
                    scope.store.leases.release(key)

    async def _submit_one(
        self, scope: RunScope, tool: LlmEngine, api: BatchApi, chunk: list[tuple[str, Member]]
    ) -> None:
        client = scope.http_client()
        members = [member for _, member in chunk]
        token = await _governed(tool, lambda: api.prepare(client, members))
        # Written down before the batch is made: a process that dies in between finds it again.
        at = time.time()
        marks = [
            (key, {"api": api.api, "token": token, "at": at, "id": cid, "n": n})
            for n, (key, (cid, _)) in enumerate(chunk)
        ]
        for key, mark in marks:
            await _write(scope, tool, key, mark)
        batch = await _governed(tool, lambda: api.create(client, token, members))
        self._polls[batch.id] = (asyncio.get_running_loop().time(), _done(batch))
        for key, mark in marks:
            await _write(scope, tool, key, {**mark, "batch": batch.id})

    async def _adopted(
        self, scope: RunScope, tool: LlmEngine, api: BatchApi, key: str, job: dict[str, Any]
    ) -> str:
        """The batch of a call whose marker names only its submission's token: being made right
        now (here, or by the process holding the call's lease: wait for it), or to be found (over
        OpenAI's uploaded file, made if it never was).  A submission whose batch was never made
        is forgotten: the call joins the next one."""
        leases = scope.store.leases
        if key in self._submitting or not await leases.take(key):
            raise _sleep(GATHER)
        try:
            batch_id = await self._adopt(scope, tool, api, job)
            await _write(scope, tool, key, None if batch_id is None else {**job, "batch": batch_id})
        except NotYet:
            raise _sleep(_LOST) from None
        finally:
            leases.release(key)
        if batch_id is None:
            raise _sleep(0.0)  # no marker now: the call joins the next submission
        return batch_id

    async def _adopt(
        self, scope: RunScope, tool: LlmEngine, api: BatchApi, job: dict[str, Any]
    ) -> str | None:
        """The batch made under the marker's token by a process that died before writing its id
        down: found once for every row of that submission."""
        token = str(job["token"])
        future = self._adopting.get(token)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            since = float(job.get("at") or 0.0)
            future = self._adopting[token] = asyncio.get_running_loop().create_task(
                _found(scope, tool, api, token, since, [str(job.get("id"))])
            )
        return await asyncio.shield(future)

    # -- following -----------------------------------------------------------------------------

    async def _poll(
        self, scope: RunScope, tool: LlmEngine, api: BatchApi, batch_id: str
    ) -> tuple[Job, float]:
        """The batch as last seen (polled again once its interval is over), and when it was seen."""
        loop = asyncio.get_running_loop()
        seen = self._polls.get(batch_id)
        if seen is not None:
            polled, future = seen
            fresh = future.done() and not future.cancelled() and future.exception() is None
            if not future.done() or (fresh and loop.time() < polled + _interval(future.result())):
                return await asyncio.shield(future), polled
        future = loop.create_task(_governed(tool, lambda: api.retrieve(scope.http_client(), batch_id)))
        self._polls[batch_id] = (loop.time(), future)
        return await asyncio.shield(future), loop.time()

    async def _read(self, scope: RunScope, tool: LlmEngine, api: BatchApi, batch: Job) -> dict[str, Any]:
        """The finished batch's answers, read once for every row waiting on it."""
        future = self._results.get(batch.id)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            client = scope.http_client()
            future = self._results[batch.id] = asyncio.get_running_loop().create_task(
                _governed(tool, lambda: api.results(client, batch))
            )
        return await asyncio.shield(future)


def _chunks(
    api: BatchApi, tool: LlmEngine, gathered: list[tuple[str, Any]]
) -> list[list[tuple[str, Member]]]:
    """The calls gathered, as ``(address, member)``, in batches each within the provider's
    limits: ``MOST`` requests, and its bytes (Gemini's inlined requests: 20 MB in all)."""
    chunks: list[list[tuple[str, Member]]] = [[]]
    size = 0
    for key, values in gathered:
        body = tool.body(values["messages"])
        weight = len(json.dumps(body, ensure_ascii=False).encode("utf-8")) + 100  # and its custom id
        if chunks[-1] and (len(chunks[-1]) >= MOST or size + weight > api.most_bytes):
            chunks.append([])
            size = 0
        chunks[-1].append((key, (custom_id(key), body)))
        size += weight
    return [chunk for chunk in chunks if chunk]


def _marker(value: Any, api: str) -> dict[str, Any] | None:
    """A job marker as this version reads it (one written before markers named their provider is
    OpenAI's, its token the uploaded file); None when there is none, or it is another provider's."""
    if not isinstance(value, dict):
        return None
    job = {"api": "openai", **value}
    if "token" not in job and "file" in job:
        job["token"] = job["file"]
    return job if job["api"] == api and "token" in job else None


async def _write(scope: RunScope, tool: LlmEngine, key: str, mark: dict[str, Any] | None) -> None:
    """The call's job marker, written down (None: cleared)."""
    await scope.store.commit(
        record(job_address(key), tool=tool.name, stored=mark, tagged=False, at=scope.clock())
    )


async def _found(
    scope: RunScope, tool: LlmEngine, api: BatchApi, token: str, since: float, ids: list[str]
) -> str | None:
    client = scope.http_client()
    found = await _governed(tool, lambda: api.find(client, token, since, ids))
    if found is None and isinstance(api, OpenAiBatches):  # the uploaded file still holds the requests
        return (await _governed(tool, lambda: api.create(client, token, []))).id
    return found


def _interval(batch: Job) -> float:
    """How long to wait before polling a batch again: a tenth of its age, from 1 s up to a minute."""
    age = time.time() - batch.created if batch.created is not None else 0.0
    return min(60.0, max(1.0, age / 10.0))


def _sleep(seconds: float) -> Sleeping:
    seconds = max(seconds, 0.05)
    return Sleeping(asyncio.get_running_loop().time() + seconds, time.time() + seconds)


def _done(value: Job) -> asyncio.Future[Job]:
    future: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


async def _governed(tool: LlmEngine, send: Callable[[], Awaitable[T]]) -> T:
    """A batch request through the tool's provider (retried on 429 and 5xx), waiting in place."""
    provider = tool.provider
    if provider is None:
        return await send()
    return await dispatch(provider, send, Ticket(tool.name, WaitBudget(provider.max_wait), suspend=False))
