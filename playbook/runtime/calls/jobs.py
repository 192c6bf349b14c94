"""Batch jobs: the call pipeline's route for an LLM tool in ``mode="batch"``.

A call that misses its receipt is not sent: it joins this run's next submission and its row
sleeps.  Misses gather for ``GATHER`` seconds (rows step aside meanwhile, so every row's miss
joins, not only the rows a worker holds), then go out as one batch job.  What was submitted is
written down before anything else, one *job marker* per call (the file, then the batch id), so a
kernel restarted during a 24-hour batch finds its calls' batch again and never submits them twice::

    no marker       join the next submission; sleep
    file, no batch  the batch's creation was cut short: find the batch made over that file, or make it
    batch           poll it (once per interval for every row waiting on it); sleep until the next poll
    finished        its answer lands as the call's receipt, like any paid call's
                    (a request the batch failed, or a batch that expired, fails its row and clears
                    its marker: the next run submits it again)

Sleeping is durable in the sense that matters: the marker outlives the process, and a row that
wakes in a new run polls the same batch.
"""

from __future__ import annotations

import asyncio
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
from playbook.tools.llm.batch import FINISHED, BatchApi
from playbook.tools.llm.engine import LlmEngine, reply_of

if TYPE_CHECKING:
    import httpx

    from playbook.store import StoreEngine

__all__ = ["GATHER", "Jobs"]

GATHER = 1.0  # seconds misses gather before they go out as one batch
MOST = 50_000  # requests in one batch (OpenAI's limit)
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
        self._gathering: dict[str, list[tuple[str, Any]]] = {}  # tool -> (address, messages)
        self._submitting: set[str] = set()  # addresses joined and not yet written down (their leases held)
        self._failed: dict[str, BaseException] = {}  # address -> why its submission failed
        self._adopting: dict[str, asyncio.Future[str]] = {}  # file id -> its batch id, being found
        self._polls: dict[str, tuple[float, asyncio.Future[dict[str, Any]]]] = {}  # batch id -> (when, batch)
        self._results: dict[str, asyncio.Future[dict[str, Any]]] = {}  # batch id -> custom_id -> answer
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
        mark = job_address(key)
        found = await scope.store.alookup(mark)
        job = found.value if found is not MISSING else None
        if not isinstance(job, dict):
            await self._join(scope, tool, key, values)
            raise _sleep(GATHER + 0.5)
        batch_id = job.get("batch") or await self._adopted(scope, tool, key, str(job["file"]))
        batch, polled = await self._poll(scope, tool, batch_id)
        if batch.get("status") not in FINISHED:
            raise _sleep(polled + _interval(batch) - asyncio.get_running_loop().time())
        results = await self._read(scope, tool, batch)
        got = results.get(key)
        if isinstance(got, dict):
            # answered by a batch job: priced at the batch price, replayed or not
            return {**reply_of(tool.name, got), "batch": True}
        await scope.store.commit(record(mark, tool=tool.name, stored=None, tagged=False, at=scope.clock()))
        why = (
            got if isinstance(got, str) else f"the batch ended {batch.get('status')} without an answer to it"
        )
        raise ToolError(
            f"llm tool {tool.name!r}: batch {batch_id}: {why} (the next run submits it again)", tool=tool.name
        )

    # -- submitting ----------------------------------------------------------------------------

    async def _join(self, scope: RunScope, tool: LlmEngine, key: str, values: Any) -> None:
        """Join the next submission, unless this call is in one under way, here or in another
        process (which holds its lease until its batch is written down)."""
        if key in self._submitting:
            return  # its row woke before its submission was written down (a slow upload)
        leases = scope.store.leases
        if not await leases.take(key):
            return  # another process is submitting it: its marker will say where
        found = await scope.store.alookup(job_address(key))
        if found is not MISSING and isinstance(found.value, dict):
            leases.release(key)  # submitted and written down between our look and our lease
            return
        cost = tool.price(values)
        try:
            # a batch may take hours to settle: no waiting on it
            await scope.costs.reserve(tool, cost, wait=False)
        except BaseException:
            leases.release(key)
            raise
        self.reserved[key] = cost
        self._submitting.add(key)
        members = self._gathering.get(tool.name)
        if members is None:
            members = self._gathering[tool.name] = []
            loop = asyncio.get_running_loop()
            loop.call_later(GATHER, lambda: self._track(loop.create_task(self._submit(scope, tool))))
        members.append((key, values["messages"]))

    async def _submit(self, scope: RunScope, tool: LlmEngine) -> None:
        members = self._gathering.pop(tool.name, [])
        for start in range(0, len(members), MOST):
            chunk = members[start : start + MOST]
            try:
                await self._submit_one(scope, tool, chunk)
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

    async def _submit_one(self, scope: RunScope, tool: LlmEngine, members: list[tuple[str, Any]]) -> None:
        api, client, store = BatchApi(tool), scope.http_client(), scope.store
        content = api.lines(members)
        file_id = await _governed(tool, lambda: api.upload(client, content))
        # Written down before the batch is made: a process that dies in between finds it again.
        for key, _ in members:
            await store.commit(
                record(
                    job_address(key), tool=tool.name, stored={"file": file_id}, tagged=False, at=scope.clock()
                )
            )
        batch = await _governed(tool, lambda: api.create(client, file_id))
        self._polls[str(batch["id"])] = (asyncio.get_running_loop().time(), _done(batch))
        for key, _ in members:
            stored = {"file": file_id, "batch": batch["id"]}
            await store.commit(
                record(job_address(key), tool=tool.name, stored=stored, tagged=False, at=scope.clock())
            )

    async def _adopted(self, scope: RunScope, tool: LlmEngine, key: str, file_id: str) -> str:
        """The batch of a call whose marker names only its file: being made right now (here, or
        by the process holding the call's lease: wait for it), or to be found or made."""
        leases = scope.store.leases
        if key in self._submitting or not await leases.take(key):
            raise _sleep(GATHER)
        try:
            return await self._adopt(scope, tool, job_address(key), file_id)
        finally:
            leases.release(key)

    async def _adopt(self, scope: RunScope, tool: LlmEngine, mark: str, file_id: str) -> str:
        """The batch over ``file_id`` (made by a process that died before writing its id down),
        or a new one over the same file: found once for every row of that file."""
        future = self._adopting.get(file_id)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            future = self._adopting[file_id] = asyncio.get_running_loop().create_task(
                _found(scope, tool, file_id)
            )
        batch_id = await asyncio.shield(future)
        stored = {"file": file_id, "batch": batch_id}
        await scope.store.commit(record(mark, tool=tool.name, stored=stored, tagged=False, at=scope.clock()))
        return batch_id

    # -- following -----------------------------------------------------------------------------

    async def _poll(self, scope: RunScope, tool: LlmEngine, batch_id: str) -> tuple[dict[str, Any], float]:
        """The batch as last seen (polled again once its interval is over), and when it was seen."""
        loop = asyncio.get_running_loop()
        seen = self._polls.get(batch_id)
        if seen is not None:
            polled, future = seen
            fresh = future.done() and not future.cancelled() and future.exception() is None
            if not future.done() or (fresh and loop.time() < polled + _interval(future.result())):
                return await asyncio.shield(future), polled
        future = loop.create_task(
            _governed(tool, lambda: BatchApi(tool).retrieve(scope.http_client(), batch_id))
        )
        self._polls[batch_id] = (loop.time(), future)
        return await asyncio.shield(future), loop.time()

    async def _read(self, scope: RunScope, tool: LlmEngine, batch: dict[str, Any]) -> dict[str, Any]:
        """The finished batch's answers, read once for every row waiting on it."""
        batch_id = str(batch["id"])
        future = self._results.get(batch_id)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            api, client = BatchApi(tool), scope.http_client()
            future = self._results[batch_id] = asyncio.get_running_loop().create_task(
                _governed(tool, lambda: api.results(client, batch))
            )
        return await asyncio.shield(future)


async def _found(scope: RunScope, tool: LlmEngine, file_id: str) -> str:
    api, client = BatchApi(tool), scope.http_client()
    batch = await _governed(tool, lambda: api.find(client, file_id))
    if batch is None:
        batch = await _governed(tool, lambda: api.create(client, file_id))
    return str(batch["id"])


def _interval(batch: dict[str, Any]) -> float:
    """How long to wait before polling a batch again: a tenth of its age, from 1 s up to a minute."""
    created = batch.get("created_at")
    age = time.time() - created if isinstance(created, (int, float)) else 0.0
    return min(60.0, max(1.0, age / 10.0))


def _sleep(seconds: float) -> Sleeping:
    seconds = max(seconds, 0.05)
    return Sleeping(asyncio.get_running_loop().time() + seconds, time.time() + seconds)


def _done(value: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
    future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


async def _governed(tool: LlmEngine, send: Callable[[], Awaitable[T]]) -> T:
    """A Batch API request through the tool's provider (retried on 429 and 5xx), waiting in place."""
    provider = tool.provider
    if provider is None:
        return await send()
    return await dispatch(provider, send, Ticket(tool.name, WaitBudget(provider.max_wait), suspend=False))
