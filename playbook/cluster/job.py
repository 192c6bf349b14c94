"""A play over a Dask DataFrame on a cluster: one partition per task, one job on the client.

The client works out where each partition's rows sit in the whole frame (their lengths), pickles
the play once with its providers' limits shared at the job's Redis, and submits one task per
partition.  While they run, it drains the partitions' reports into a :class:`ClusterState`
that the usual views show.  A stop is a key the partitions read; their runs stop as a local run
does (calls in flight land their receipts, the rest is skipped).  A retry submits the partitions
with failed or parked rows again, running only those rows over the partition's last result.

Dask reruns the task of a worker that died elsewhere: the new attempt reuses the receipts and
memos already in Redis, waits out the leases of calls the dead worker had in flight, and pays
only for those.  The dead attempt's requests still count, from what it tallied in Redis
(:meth:`ClusterState._cut_short`); the rows count as the built result has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pandas as pd

from playbook._internal.chain import Chain
from playbook._internal.loop import check_blocking, finished, run_sync, schedule
from playbook._internal.renamed import old_attribute, renamed
from playbook.cluster.results import conform, profile, statuses, unify
from playbook.cluster.state import ClusterState
from playbook.cluster.wire import Channel, plain_hops
from playbook.cluster.worker import Failure, Part, partition_error, run_partition
from playbook.errors import PlayDefinitionError, ReceiptError, interrupted
from playbook.events import RunFinished, RunStarted
from playbook.plays.play import Play
from playbook.providers.provider import sharing_limits
from playbook.records import ProviderWait, RunStats
from playbook.runtime.calls.telemetry import telemetry
from playbook.runtime.options import RunOptions
from playbook.runtime.run import events_of, remember
from playbook.runtime.state.eventlog import EventLog
from playbook.runtime.state.reading import ERROR_COLUMNS, LEG_COLUMNS
from playbook.secrets import sending_to_workers
from playbook.store.engine import StoreEngine

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client, Future

__all__ = ["ClusterRun"]

_POLL = 0.1  # seconds between drains of the reports
_GRACE = 30.0  # seconds a stopped job's partitions have to land what they sent


class ClusterRun:
    """One run of a play over a Dask DataFrame: ``run.result`` (a Dask DataFrame once it is
    done), ``run.stats``, ``run.errors``, ``run.parked``, ``run.waiting_on``; ``wait()``, ``stop()``,
    ``retry()``; ``run.state`` for views."""

    def __init__(
        self,
        frame: dd.DataFrame,
        play: Play,
        opts: RunOptions,
        client: Client,
        url: str,
        options: dict[str, Any],
    ) -> None:
        import cloudpickle

        self.job = uuid.uuid4().hex[:16]
        self._frame = frame
        self._play = play
        self._opts = opts
        self._client = client
        self._url = url
        self._channel = Channel(url, self.job)
        try:
            info = client.scheduler_info()
            hops = plain_hops([info["address"], *info["workers"]])
            with (
                sharing_limits(url),
                sending_to_workers(hops),
            ):  # one rate per provider account; a secret's default, if safe
                self._payload = cloudpickle.dumps((play, options))
        except Exception as exc:  # what cannot travel: a secret's value, a lock, an open file or client
            raise PlayDefinitionError(
                f"play {play.name!r} cannot be sent to the cluster's workers: {exc}. Everything a play uses is pickled "
                "(cloudpickle) and sent; make what cannot travel inside the play or its tools instead"
            ) from None
        self._parts = frame.to_delayed()
        self._lengths: list[int] = []
        self._offsets: list[int] = []
        self._futures: list[Future | None] = []
        self._result: dd.DataFrame | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._round = 0  # each submission names its tasks afresh
        self._chain = Chain(self)  # a retry is a ClusterRun of its own
        self.previous: ClusterRun | None = None  # the run this one retried
        self.state = ClusterState(play=play.name)
        self.state.paid_by = self._channel.paid_by
        self.view: Any = None
        self.log: EventLog | None = None  # where its events go (events=), if anywhere
        self._execution = 0
        if opts.events not in (None, False):
            self.log = EventLog(self.state, opts.events)
        # The job's span, on the client; each partition's run, on its worker, is a child of it.
        self.telemetry = telemetry(self.state)

    def __repr__(self) -> str:
        s = self.state
        return (
            f"<ClusterRun {self._play.name!r} {s.phase}: {s.total} rows in {len(self._parts)} partitions, ok={s.ok} "
            f"reused={s.reused} failed={s.failed} parked={s.parked} skipped={s.skipped}, calls {s.calls_executed} paid / "
            f"{s.calls_shared} shared / {s.calls_reused} from receipts>"
        )

    def _repr_html_(self) -> str:
        from playbook.ui.html import run_html

        return run_html(self.state)

    # -- what a user reads -------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.job

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def stats(self) -> RunStats:
        return self.state.stats()

    @property
    def result(self) -> dd.DataFrame:
        """The result as a Dask DataFrame (its partitions stay on the workers; ``.compute()``
        brings it here): input columns, output columns, ``play_status``, ``play_error``.  After
        a retry, each run of the chain gives the latest result (every row, as it stands)."""
        latest = self._chain.latest(self)
        if latest is not self:
            return latest.result
        if self._result is None:
            raise PlayDefinitionError(
                "the cluster run has not finished: run.wait() returns its result once it has"
            )
        return self._result

    @property
    def waiting_on(self) -> list[ProviderWait]:
        return self.state.holds()

    def __getattr__(self, name: str) -> Any:
        return old_attribute(self, name, _OLD)

    @property
    def notices(self) -> list[str]:
        return list(self.state.notices)

    @property
    def errors(self) -> pd.DataFrame:
        """Failed rows: index label, position in the whole frame, error message."""
        return pd.DataFrame(self.state.failed_rows(), columns=ERROR_COLUMNS)

    @property
    def parked(self) -> pd.DataFrame:
        frame = pd.DataFrame(
            self.state.parked_rows(), columns=["row", "position", "reason", "provider", "ready_at", "message"]
        )
        frame["ready_at"] = pd.to_datetime(frame["ready_at"], unit="s", utc=True)
        return frame

    @property
    def waterfalls(self) -> pd.DataFrame:
        """Per waterfall leg, summed over the partitions: hits, misses, unavailable, errors, never reached."""
        return pd.DataFrame(self.state.leg_rows(), columns=LEG_COLUMNS)

    @property
    def workers(self) -> pd.DataFrame:
        """Per worker: partitions running and finished, rows done of its partitions, calls paid,
        rows in flight."""
        return pd.DataFrame(
            self.state.workers(),
            columns=["worker", "running", "finished", "done", "rows", "calls_executed", "in_flight"],
        )

    # -- what a user does --------------------------------------------------------------

    def wait(self) -> dd.DataFrame:
        """Block until a background run finishes; returns the result."""
        if self.running:
            check_blocking("run.wait()", "await run")
            run_sync(finished(self._task))  # type: ignore[arg-type]  # running: there is a task
        if self._task is not None and self._task.done() and not self._task.cancelled():
            exc = self._task.exception()
            if exc is not None:
                raise exc
        return self.result

    def __await__(self) -> Generator[Any, None, dd.DataFrame]:
        return self._finish().__await__()

    async def _finish(self) -> dd.DataFrame:
        if self._task is not None and not self._task.done():
            await finished(self._task)
        return self.wait()

    def events(self) -> list[dict[str, Any]]:
        """What happened in this job, as it was kept with ``events=`` (see :meth:`playbook.Run.events`):
        its rows' holds, parks and outcomes, and a ``calls`` line per report of a partition's
        calls (the calls themselves are made and counted on the workers)."""
        return events_of(self.log, self.run_id, self._execution, "run")

    def stop(self) -> None:
        """Stop the job on every worker: calls in flight land their receipts, the rows not
        finished are skipped; what finished is in Redis, and running it again resumes it."""
        self._stopped = True
        self.state.stop_requested()
        with contextlib.suppress(Exception):  # a Redis out of reach: the job ends as it would
            self._channel.stop()

    def retry(self, *, statuses: tuple[str, ...] = ("failed", "parked")) -> ClusterRun:
        """Run the failed and parked rows (or those with ``statuses``) again on the cluster, each
        partition that has any over its last result; blocking, or in the background if the run was.
        Returns the retry's own ``ClusterRun`` (see :meth:`playbook.Run.retry`): its ``stats``
        count the retry alone, ``previous`` is the run before, its ``result`` has every row."""
        if not statuses or any(s not in ("failed", "parked") for s in statuses):
            raise PlayDefinitionError(f"retry(statuses={statuses!r}): retry 'failed' and/or 'parked' rows")
        latest = self._chain.latest(self)
        if latest.running:
            raise PlayDefinitionError(
                "the cluster run is still going: retry once it has finished (run.wait())"
            )
        todo = latest.state.standing(statuses, self._offsets, self._lengths)
        if not todo:
            return latest
        again = copy.copy(latest)
        again.previous = latest
        again.state = ClusterState(play=self._play.name, before=latest.state)
        again.state.paid_by = self._channel.paid_by
        again.state.ran = frozenset(self._offsets[part] + p for part, rows in todo.items() for p in rows)
        again._futures, again._result, again._task, again._stopped = list(latest._futures), None, None, False
        self._chain.follow(again)
        if latest.view is not None:
            # the view shows the retry (its own counters) where it showed the run
            latest.view.follow(again.state)
        if latest.telemetry is not None:
            latest.telemetry.follow(again.state)
        if latest.log is not None:
            latest.log.follow(again.state)  # the same file, the next execution
            again._execution = latest.log.execution
        remember(again)
        self._channel.reset()
        if latest._task is not None:
            again._task = schedule(again._execute(todo))
        else:
            again._block(again._execute(todo))
        return again

    # -- running -------------------------------------------------------------------------

    def start(self, *, background: bool) -> ClusterRun:
        if background:
            self._task = schedule(self._execute(None))
        else:
            self._block(self._execute(None))
        return self

    def _block(self, work: Any) -> None:
        try:
            run_sync(work)
        except KeyboardInterrupt:
            # Ctrl-C has stopped the job on every worker, not only here: what they sent landed, the
            # rest is skipped.
            s = self.state
            raise interrupted(
                f"interrupted: {s.ok + s.reused} of {s.total} rows done on the cluster, {s.skipped} skipped. What finished is "
                "saved in Redis: running the same map again resumes it"
            ) from None

    async def _execute(self, retry: dict[int, dict[int, str]] | None) -> None:
        """Submit the partitions (all, or a retry's), follow their reports, build the result.
        Cancelled (Ctrl-C), it stops the job and waits for the partitions to land what they sent."""
        if retry is None:
            await self._measure()
            todo: dict[int, tuple[int, ...] | None] = {
                part: None for part, length in enumerate(self._lengths) if length
            }
            for part in todo:
                self.state.expect(part)
        else:
            todo = {part: tuple(rows) for part, rows in retry.items()}
            await self._others(retry)
        self._round += 1  # a retry starts from the round of the run it follows
        rows = sum(self._lengths) if retry is None else sum(len(rows) for rows in retry.values())
        self.state.emit(RunStarted(self.job, self._play.name, rows))
        try:
            futures = self._submit(todo)
            await self._follow(futures)
            self._result = await self._build()
        except asyncio.CancelledError:
            self.stop()
            await self._settle()  # a second Ctrl-C cuts this short
            raise
        finally:
            _remember(self._url)
            if self.state.finished is None:
                self.state.apply(self._channel.drained())
                self.state.emit(RunFinished(self.job, self._stopped))

    async def _measure(self) -> None:
        """Each partition's length (with ``limit``, as many as the first N rows take)."""
        import dask

        futures = self._client.compute([dask.delayed(len)(part) for part in self._parts])
        await _done(futures)
        lengths = [int(f.result()) for f in futures]
        if self._opts.limit is not None:
            left = self._opts.limit
            for i, length in enumerate(lengths):
                lengths[i] = min(length, left)
                left -= lengths[i]
        self._lengths = lengths
        self._offsets = [sum(lengths[:i]) for i in range(len(lengths))]
        self._futures = [None] * len(lengths)

    async def _others(self, retry: dict[int, dict[int, str]]) -> None:
        """A retry's partitions: what their rows not run again count (their last result's
        statuses, less the rows run again), which is not the retry's to count."""
        parts = list(retry)
        counted = self._client.map(statuses, [self._futures[part] for part in parts], pure=False)
        await _done(counted)
        for part, found in zip(parts, counted):
            others = dict(found.result())
            for status in retry[part].values():
                others[status] -= 1
            self.state.expect(part, others)

    def _submit(self, todo: dict[int, tuple[int, ...] | None]) -> dict[int, Future]:
        import dask

        task = dask.delayed(run_partition, pure=False)
        calls = []
        for part, positions in todo.items():
            spec = Part(
                self.job,
                part,
                self._offsets[part],
                self._url,
                self._lengths[part] if positions is None else None,
                positions,
                self.telemetry.carrier() if self.telemetry is not None else None,
            )
            previous = self._futures[part] if positions is not None else None
            name = f"playbook-{self._play.name}-{self.job}-{self._round}-{part}"
            calls.append(task(self._parts[part], self._payload, spec, previous, dask_key_name=name))
        futures = dict(zip(todo, self._client.compute(calls)))
        for part, future in futures.items():
            self._futures[part] = future
        return futures

    async def _follow(self, futures: dict[int, Future]) -> None:
        """Drain reports until every partition's task is over; a task that failed (a worker
        that died too often, ``on_error="raise"``) stops the job and is raised."""
        failed: BaseException | None = None
        try:
            while True:
                self.state.apply(self._channel.drained())
                pending = [f for f in futures.values() if not f.done()]
                if failed is None:
                    failed = self._failure(futures)
                    if failed is not None:
                        self.stop()
                if not pending:
                    break
                await asyncio.sleep(_POLL)
        except asyncio.CancelledError:
            self.stop()
            raise
        if failed is not None:
            raise failed

    def _failure(self, futures: dict[int, Future]) -> BaseException | None:
        """The error of the first partition that could not finish, if one could not."""
        for part, future in futures.items():
            try:
                if future.status == "error":  # Dask could not run it (its workers kept dying)
                    return partition_error(self._play.name, part, future.exception(), self._opts.on_error)
                if future.status == "finished" and future.type is Failure:
                    said = future.result()
                    return partition_error(
                        self._play.name, part, said.error, self._opts.on_error, said.worker
                    )
            except Exception as exc:  # what the worker said could not even be read here
                return partition_error(self._play.name, part, exc, "isolate")
        return None

    async def _settle(self) -> None:
        """After a stop: give the partitions time to land what they sent."""
        futures = [f for f in self._futures if f is not None]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_done(futures), _GRACE)
        self.state.apply(self._channel.drained())
        if self.state.finished is None:
            self.state.emit(RunFinished(self.job, True))

    async def _build(self) -> dd.DataFrame:
        import dask
        import dask.dataframe as dd

        parts = [part for part, f in enumerate(self._futures) if f is not None]
        futures = [self._futures[part] for part in parts]
        if not futures:  # no rows at all: what pandas gives for none, run here (it calls nothing)
            inputs = {name: pd.Series(dtype=dtype) for name, dtype in self._frame.dtypes.items()}
            none = pd.DataFrame(inputs).play.map(self._play, progress=False, store="memory")
            with dask.config.set({"dataframe.convert-string": False}):
                return dd.from_pandas(none, npartitions=1)
        profiles = self._client.map(profile, futures, pure=False)
        counted = self._client.map(statuses, futures, pure=False)
        await _done(profiles + counted)
        # The rows count as the result has them (a partition Dask computed again after its worker
        # died came back from its memos), after the partitions' last words.
        self.state.apply(self._channel.drained())
        for part, found in zip(parts, counted):
            self.state.settle(part, found.result())
        from dask.dataframe.utils import pyarrow_strings_enabled

        text = pyarrow_strings_enabled()  # Dask's own convert-string setting
        columns, dtypes = unify([f.result() for f in profiles], list(self._frame.columns), text=text)
        shaped = self._client.map(conform, futures, columns=columns, dtypes=dtypes, pure=False)
        await _done(shaped)
        meta = pd.DataFrame({c: pd.Series(dtype=d) for c, d in zip(columns, dtypes)}, columns=columns)
        whole = self._opts.limit is None and len(futures) == len(self._parts)
        divisions = self._frame.divisions if whole and self._frame.known_divisions else None
        # Shaped already (see .results): Dask's convert-string, applied again, would turn a column
        # of dicts or lists into their repr.
        with dask.config.set({"dataframe.convert-string": False}):
            return dd.from_delayed(shaped, meta=meta, divisions=divisions, verify_meta=False)


async def _done(futures: list[Future]) -> None:
    # Dask's futures are not awaitable on this loop
    while not all(f.done() for f in futures):  # noqa: ASYNC110
        await asyncio.sleep(_POLL / 2)


def _remember(url: str) -> None:
    """The store's mark, as this machine saw the job end (marks.py): wiped later, it is noticed here."""
    with contextlib.suppress(ReceiptError):
        store = StoreEngine(url)
        store.remember()
        store.close()


def _holds(run: ClusterRun) -> list[ProviderWait]:
    renamed("ClusterRun.holds", "ClusterRun.waiting_on")  # a down provider is not a hold
    return run.waiting_on


# Deprecated names, served by __getattr__: they work (warning) and dir(run) leaves them out.
_OLD: dict[str, Callable[[Any], Any]] = {"holds": _holds}
