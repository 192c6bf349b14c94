"""B1r's second baseline: a hand-written asyncio loop on the same Redis server, keeping what
playbook promises.

The pipelined ``SET`` and ``GET`` loops write and read records and do nothing else.  A run keeps
promises, and each one is a round trip the row waits for:

- never pay twice, across processes: a call is leased before it is made (``SET NX PX``, the
  leases asked in one turn of the loop in one round trip, with the receipts read again in it:
  another process may have just paid);
- a crash loses nothing paid for: the receipt, its tool's index entry and the lease given back
  go in one ``MULTI``/``EXEC`` (the receipts of one turn together) before the row goes on;
- a rerun is a resume: a memo per row and its index entry, a thousand a round trip, not waited for.

A new version of the play over the receipts reads them ahead, as playbook does: the receipts of
the next 512 rows in one ``MGET``, asked as the rows before them start; and writes its memos.
Its rows are worked by a pool of workers pulling them from one iterator (as many as the play's
concurrency), not a task each.  This loop does that and nothing else (no retries, rates,
progress or errors), with redis-py's asyncio client on the loop: what any code that keeps those
promises pays.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from .harness import worker_pool

__all__ = ["kept_loop"]

_MEMOS = 1000
AHEAD = 512  # rows whose receipts are read in one MGET, ahead of them (as playbook's read-ahead)


class _Turn:
    """What rows ask in one turn of the loop, sent in one round trip: ``ask(item)`` is its answer."""

    def __init__(self, send: Callable[[list[Any]], Awaitable[list[Any]]]) -> None:
        self._send = send
        self._items: list[Any] = []
        self._answers: list[asyncio.Future[Any]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def ask(self, item: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self._items.append(item)
        self._answers.append(answer)
        if len(self._items) == 1:
            loop.call_soon(self._go)
        return answer

    def _go(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self) -> None:
        items, answers = self._items, self._answers
        self._items, self._answers = [], []
        for answer, value in zip(answers, await self._send(items)):
            answer.set_result(value)


def kept_loop(url: str, values: list[int], tool: str, version: str, concurrency: int) -> float:
    """Run version ``version`` of the loop's play (one call of ``tool`` a row) over ``values`` on
    the Redis server at ``url``; return rows per second.  Version "1" makes its calls (a first
    run: leased, then looked up); any other reads the receipts version "1" left."""
    import redis.asyncio as aredis

    async def main() -> float:
        client = aredis.Redis.from_url(url)
        start = time.perf_counter()
        await _run(client, values, tool, version, concurrency)
        seconds = time.perf_counter() - start
        await client.aclose()
        return len(values) / seconds

    return asyncio.run(main())


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _ahead(
    client: Any, values: list[int], tool: str
) -> Iterator[tuple[int, str, asyncio.Task[list[Any]], int]]:
    """Each row's value, its call's key, and where its receipt read ahead is (a task, an index):
    the receipts of the next ``AHEAD`` rows asked in one ``MGET`` as the rows before them start."""

    async def read(keys: list[str]) -> list[Any]:
        return list(await client.mget([f"kept:{key}" for key in keys]))

    def chunk(first: int) -> tuple[list[tuple[int, str]], asyncio.Task[list[Any]]]:
        rows = [(x, _key(tool, "1", {"n": x})) for x in values[first : first + AHEAD]]
        return rows, asyncio.get_running_loop().create_task(read([key for _, key in rows]))

    following = chunk(0)
    for first in range(0, len(values), AHEAD):
        (rows, found), following = (
            following,
            chunk(first + AHEAD) if first + AHEAD < len(values) else following,
        )
        for i, (x, key) in enumerate(rows):
            yield x, key, found, i


async def _run(
    client: Any, values: list[int], tool: str, version: str, concurrency: int
) -> list[dict[str, Any]]:
    memos: list[tuple[str, str]] = []
    flushes: set[asyncio.Task[None]] = set()

    async def take(keys: list[str]) -> list[tuple[bool, bytes | None]]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.set(f"kept:lease:{key}", "me", nx=True, px=30_000)
        pipe.mget([f"kept:{key}" for key in keys])
        *got, found = await pipe.execute()
        return list(zip((bool(ok) for ok in got), found))

    async def write(records: list[tuple[str, str]]) -> list[None]:
        pipe = client.pipeline(transaction=True)
        pipe.mset({f"kept:{key}": value for key, value in records})
        pipe.sadd(f"kept:tool:{tool}", *[key for key, _ in records])
        pipe.delete(*[f"kept:lease:{key}" for key, _ in records])
        await pipe.execute()
        return [None] * len(records)

    async def flush(batch: list[tuple[str, str]]) -> None:
        pipe = client.pipeline(transaction=True)
        pipe.mset(dict(batch))
        pipe.sadd("kept:memos", *[key for key, _ in batch])
        await pipe.execute()

    takes, writes = _Turn(take), _Turn(write)

    async def one(row: tuple[int, str, asyncio.Task[list[Any]], int]) -> dict[str, Any]:
        x, key, ahead, i = row
        # A first run has no receipts to read ahead (playbook reads those its rows used last time).
        found = None if version == "1" else (await ahead)[i]
        if found is None:
            leased, found = await takes.ask(key)
            if not leased:
                raise RuntimeError(f"the lease on {key} is held")
        if found is None:
            value: Any = {"n": x, "label": f"item-{x}"}
            await writes.ask((key, json.dumps(value)))
        else:
            value = json.loads(found)
        output = {"v": value}
        memos.append((f"kept:m{_key('first', version, {'n': x})}", json.dumps(output)))
        if len(memos) >= _MEMOS:
            task = asyncio.get_running_loop().create_task(flush(memos.copy()))
            flushes.add(task)
            task.add_done_callback(flushes.discard)
            memos.clear()
        return output

    rows = (
        _ahead(client, values, tool)
        if version != "1"
        else ((x, _key(tool, "1", {"n": x}), None, 0) for x in values)
    )
    results = await worker_pool(rows, one, len(values), concurrency)  # type: ignore[arg-type]
    if memos:
        await flush(memos)
    await asyncio.gather(*flushes)
    return results
