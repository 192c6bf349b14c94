"""The engines a play runs on, behind one small interface, for the promise suite (``test_promises_*``).

* ``one process``: ``frame.play.run(...)`` in this process, on a store directory (SQLite);
* ``processes``: two fresh Python processes each running the same frame, as a user starts the
  same script on two machines: one Redis store, the providers' limits shared there;
* ``cluster``: a dask.distributed ``LocalCluster`` of two worker processes, ``ddf.play.run``
  over four partitions (eight when one of its workers is killed), on one Redis;
* ``redis cluster``: the processes engine on a Redis Cluster (3 masters, each with a replica):
  the store and the providers' shared limits at the plain ``redis://`` URL of one of its nodes,
  as a user who outgrew one Redis gives it.

Each engine runs a play over a pandas frame and answers an :class:`Outcome` (the rows as the job
ends them, what the runs counted, the providers rows wait on and the parked rows); it can also stop a run midway
(``run.stop()``, or Ctrl-C for processes) and kill one of its processes with SIGKILL midway.  A
play and its tools travel to other processes as Dask sends them: pickled, providers as their
description (with their limits shared at the job's Redis), secrets as their variable's name.
Ground truth about what was paid is the demo provider's own counters, read by the tests.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import pandas as pd
import pytest
import warm
from vtime import run_virtual
from warm import Warm

import playbook as pb
from playbook._internal.redis_nodes import sync_client
from playbook.providers.provider import sharing_limits

ENGINES = ("one process", "processes", "cluster", "redis cluster")
# The promise files whose promises are about what goes on the wire (each LLM dialect's requests,
# where a key is put), the same whichever server keeps the store: the Redis Cluster engine runs
# the others, whose state lives in the store and the shared limits (receipts, memos, leases, the
# spend; rates, holds, each key's limits), and these run on the first three engines.
ON_THE_WIRE = ("test_promises_dialects", "test_promises_secrets")
PROCESSES = 2  # the processes engine's processes
WORKERS, THREADS = 2, 2  # the cluster's workers, and threads each
PARTITIONS = 4
_RANK = {
    "ok": 0,
    "reused": 1,
    "failed": 2,
    "parked": 3,
    "skipped": 4,
}  # the job's status of a row: the most finished

# A process of the processes engine: load (frame, play, options), run, write what the run says.
# With a third argument (a file's path): then wait for that file, retry, and write what the retry
# says beside the first (".retry"), with the counters of the run it retried as they are then.
_WORKER = r"""
import os, pickle, sys, time
import playbook as pb
frame, play, options = pickle.load(open(sys.argv[1], "rb"))
print("started", flush=True)
fatal = None
try:
    run = frame.play.run(play, progress=False, **options)
except pb.ReceiptError as exc:  # refused before anything ran (a store that lost its receipts)
    with open(sys.argv[2], "wb") as out:
        pickle.dump({"refused": str(exc)}, out)
    sys.exit(0)
except (pb.RunFatal, KeyboardInterrupt) as exc:
    fatal, run = f"{type(exc).__name__}: {exc}", pb.last_run()

def said(run):
    return {
        "result": run.result, "stats": run.stats.model_dump(), "waiting_on": [h.model_dump() for h in run.waiting_on],
        "parked": run.parked, "waterfalls": run.waterfalls, "fatal": fatal, "notices": run.notices,
        "previous": None if getattr(run, "previous", None) is None else run.previous.stats.model_dump(),
    }

with open(sys.argv[2], "wb") as out:
    pickle.dump(said(run), out)
if len(sys.argv) > 3:
    open(sys.argv[2] + ".ran", "w").close()  # what it wrote above is whole
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
    again = run.retry()
    with open(sys.argv[2] + ".retry", "wb") as out:
        pickle.dump(said(again), out)
"""


def engines_of(module: str) -> tuple[str, ...]:
    """The engines the promises of ``module`` (a test file's module name) run on."""
    if module.rsplit(".", 1)[-1] in ON_THE_WIRE:
        return tuple(engine for engine in ENGINES if engine != "redis cluster")
    return ENGINES


@dataclass
class Outcome:
    """What a job did: each row as the job ends it, and what its runs counted."""

    # input rows in order, outputs, play_status, play_error (pandas); None: a cluster job that a
    # fatal error stopped (no partition gave its rows back; its counters say what became of them)
    result: pd.DataFrame | None
    runs: list[dict[str, Any]]  # each run's stats (one run; one per process; the cluster job's)
    waiting_on: list[dict[str, Any]]  # the providers rows wait on (run.waiting_on)
    parked: pd.DataFrame
    waterfalls: pd.DataFrame
    fatal: str | None = None  # the error that stopped a run (RunFatal, KeyboardInterrupt)
    results: list[pd.DataFrame] = field(default_factory=list)  # each process's own result
    notices: list[str] = field(
        default_factory=list
    )  # what the runs said (run.notices), each process's in turn
    previous: list[dict[str, Any] | None] = field(
        default_factory=list
    )  # a retry's: the stats of each run it retried, then

    @property
    def statuses(self) -> dict[str, int]:
        if self.result is None:
            stats = self.runs[0]
            return {status: stats[status] for status in _RANK if stats[status]}
        return self.result["play_status"].value_counts().to_dict()

    def total(self, counter: str) -> float:
        """A counter summed over the runs (``calls_executed``, ``cost_spent``...)."""
        return sum(run[counter] for run in self.runs)


class Engine:
    """One way of running a play.  ``run`` to the end; ``stop_when`` stops it once ``when()``
    is true; ``kill_when`` kills one of its processes with SIGKILL once ``when()`` is true and
    returns the most calls that process could have had in flight, and what the job counted when
    it goes on without that process (a cluster job; else None: the counts died with it)."""

    name = ""
    # each of its processes runs every row of the job (the processes engines), rather than the
    # job's rows being shared out (one process, a Dask cluster's partitions)
    same_rows = False
    in_flight = 0  # the most calls one process (or worker) has on the wire, for a given concurrency

    def run(self, frame: pd.DataFrame, play: Any, *, virtual: bool = False, **options: Any) -> Outcome:
        """Run to the end.  ``virtual``: a promise whose every wait is the provider's or the run's
        own (rates, Retry-After, the tries' backoff), none the test's: one process runs it on
        virtual time (tests/vtime.py), on whose clock the demo served in process answers; the
        engines of several processes share a provider in a process of its own, in real time."""
        raise NotImplementedError

    def stop_when(self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any) -> Outcome:
        raise NotImplementedError

    def kill_when(
        self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any
    ) -> tuple[int, Outcome | None]:
        raise NotImplementedError

    def refused(self, frame: pd.DataFrame, play: Any, **options: Any) -> str:
        """The ``ReceiptError`` a run raises before it starts (each process's, the same)."""
        raise NotImplementedError

    def retried(
        self, frame: pd.DataFrame, play: Any, between: Callable[[Outcome], None], **options: Any
    ) -> tuple[Outcome, Outcome]:
        """Run, then ``between(outcome)``, then ``run.retry()`` in each process that ran: what the
        runs did, and what the retries did (each retry's ``previous``: its run's counters then)."""
        raise NotImplementedError

    def wipe_store(self) -> None:
        """Lose every receipt behind playbook's back: the store's directory made again, the Redis database flushed."""
        raise NotImplementedError

    def estimate(self, frame: pd.DataFrame, play: Any, **options: Any) -> pb.Estimate:
        """The estimate of a run on this engine: its pilot runs in this process, on the engine's store."""
        return frame.play.estimate(play, store=self.store, progress=False, **options)  # type: ignore[no-any-return, attr-defined]

    def setenv(self, name: str, value: str) -> None:
        """Set an environment variable (a secret) in every process that runs rows, as a user would:
        this one, the processes it starts, and a cluster's workers."""
        os.environ[name] = value

    def __repr__(self) -> str:
        return f"<Engine {self.name}>"


class OneProcess(Engine):
    name = "one process"

    def __init__(self, store: Path, scratch: Path) -> None:
        self.store = str(store)
        self.scratch = scratch

    def run(self, frame: pd.DataFrame, play: Any, *, virtual: bool = False, **options: Any) -> Outcome:
        if virtual:
            return _finished(
                lambda: run_virtual(frame.play.arun(play, store=self.store, progress=False, **options))
            )
        return _finished(lambda: frame.play.run(play, store=self.store, progress=False, **options))

    def stop_when(self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any) -> Outcome:
        return _stopped(
            lambda: frame.play.arun(play, store=self.store, progress=False, background=True, **options), when
        )

    def kill_when(
        self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any
    ) -> tuple[int, Outcome | None]:
        # One process killed is this process killed: it runs on its own for that.
        with _processes(self.scratch, frame, play, {"store": self.store, **options}, 1) as procs:
            _kill_when(procs[0], when)
        return options.get("concurrency", 16), None

    def refused(self, frame: pd.DataFrame, play: Any, **options: Any) -> str:
        with pytest.raises(pb.ReceiptError) as raised:
            self.run(frame, play, **options)
        return str(raised.value)

    def retried(
        self, frame: pd.DataFrame, play: Any, between: Callable[[Outcome], None], **options: Any
    ) -> tuple[Outcome, Outcome]:
        return _retried(lambda: frame.play.run(play, store=self.store, progress=False, **options), between)

    def wipe_store(self) -> None:
        # The directory made again, empty (this process may still hold the old file open, as a
        # kernel does; a file emptied in place between two processes is test_lost_stores's).
        shutil.rmtree(self.store)
        Path(self.store).mkdir()


class Processes(Engine):
    name = "processes"
    same_rows = True

    def __init__(self, redis_url: str, scratch: Path) -> None:
        self.store = redis_url
        self.scratch = scratch

    def run(self, frame: pd.DataFrame, play: Any, *, virtual: bool = False, **options: Any) -> Outcome:
        with _processes(
            self.scratch, frame, play, {"store": self.store, **options}, PROCESSES, share=self.store
        ) as procs:
            return _merged([_said(proc) for proc in procs])

    def stop_when(self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any) -> Outcome:
        with _processes(
            self.scratch, frame, play, {"store": self.store, **options}, PROCESSES, share=self.store
        ) as procs:
            _wait(when)
            for proc in procs:
                proc.popen.send_signal(signal.SIGINT)  # Ctrl-C in each
            return _merged([_said(proc) for proc in procs])

    def kill_when(
        self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any
    ) -> tuple[int, Outcome | None]:
        with _processes(
            self.scratch, frame, play, {"store": self.store, **options}, PROCESSES, share=self.store
        ) as procs:
            _kill_when(procs[0], when)
            for proc in procs[1:]:
                _said(proc)
        return options.get("concurrency", 16), None

    def run_while(
        self,
        frame: pd.DataFrame,
        play: Any,
        when: Callable[[], bool],
        act: Callable[[], Any],
        *,
        processes: int = PROCESSES,
        **options: Any,
    ) -> tuple[Outcome, Any]:
        """Run to the end in ``processes`` processes, doing ``act()`` once ``when()`` is true (to
        the store's server, say, not to the processes): the outcome, and what ``act()`` gave."""
        with _processes(
            self.scratch, frame, play, {"store": self.store, **options}, processes, share=self.store
        ) as procs:
            _wait(lambda: when() or all(proc.popen.poll() is not None for proc in procs))
            if not when():  # they all ended first: what they said (a refusal) says why
                said = _merged([_said(proc) for proc in procs])
                raise AssertionError(f"the run ended before the moment to act: {said.statuses}")
            acted = act()
            return _merged([_said(proc) for proc in procs]), acted

    def retried(
        self, frame: pd.DataFrame, play: Any, between: Callable[[Outcome], None], **options: Any
    ) -> tuple[Outcome, Outcome]:
        flag = Path(tempfile.mkdtemp(dir=self.scratch)) / "retry"
        options = {"store": self.store, **options}
        with _processes(self.scratch, frame, play, options, PROCESSES, share=self.store, retry=flag) as procs:
            for proc in procs:
                ran = proc.out.with_name(proc.out.name + ".ran")
                _wait(lambda: ran.exists() or proc.popen.poll() is not None, timeout=120)  # noqa: B023 - waited for here
                assert ran.exists(), proc.popen.communicate(timeout=60)[1][-3000:]
            first = _merged([_load(proc.out) for proc in procs])
            between(first)
            flag.touch()
            for proc in procs:
                proc.popen.communicate(timeout=120)
            return first, _merged([_load(proc.out.with_name(proc.out.name + ".retry")) for proc in procs])

    def refused(self, frame: pd.DataFrame, play: Any, **options: Any) -> str:
        with _processes(
            self.scratch, frame, play, {"store": self.store, **options}, PROCESSES, share=self.store
        ) as procs:
            said = {_said(proc).get("refused") for proc in procs}
        assert len(said) == 1 and None not in said, said
        return str(said.pop())

    def wipe_store(self) -> None:
        _flush(self.store)


class Cluster(Engine):
    name = "cluster"

    def __init__(self, client: Any, redis_url: str) -> None:
        self.client = client
        self.store = redis_url

    def estimate(self, frame: pd.DataFrame, play: Any, **options: Any) -> pb.Estimate:
        return self._frame(frame).play.estimate(play, store=self.store, progress=False, **options)  # type: ignore[no-any-return]

    def setenv(self, name: str, value: str) -> None:
        super().setenv(name, value)
        self.client.run(
            _setenv, name, value
        )  # a function of a module: os.environ itself would travel as a copy

    def _frame(self, frame: pd.DataFrame, partitions: int = PARTITIONS) -> Any:
        import dask.dataframe as dd

        return dd.from_pandas(frame, npartitions=partitions)

    def run(self, frame: pd.DataFrame, play: Any, *, virtual: bool = False, **options: Any) -> Outcome:
        return _finished(
            lambda: self._frame(frame).play.run(play, store=self.store, progress=False, **options)
        )

    def stop_when(self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any) -> Outcome:
        async def start() -> Any:  # a cluster job started in the background is returned at once
            return self._frame(frame).play.run(
                play, store=self.store, progress=False, background=True, **options
            )

        return _stopped(start, when)

    def kill_when(
        self, frame: pd.DataFrame, play: Any, when: Callable[[], bool], **options: Any
    ) -> tuple[int, Outcome | None]:
        client = self.client
        pids = client.run(os.getpid)

        def kill() -> None:
            _wait(when)
            busy = [w for w, keys in client.processing().items() if any("playbook-" in str(k) for k in keys)]
            os.kill(pids[busy[0]], signal.SIGKILL)  # a worker running partitions of the job now

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        try:
            # Twice as many partitions as the workers' threads: the worker killed holds results of
            # partitions it finished, which Dask computes again, besides those it was running.
            partitions = 2 * WORKERS * THREADS
            outcome = _finished(
                lambda: self._frame(frame, partitions).play.run(
                    play, store=self.store, progress=False, **options
                )
            )
        finally:
            killer.join(10)
            client.wait_for_workers(WORKERS, timeout=60)
        return options.get("concurrency", 16) * THREADS, outcome

    def refused(self, frame: pd.DataFrame, play: Any, **options: Any) -> str:
        with pytest.raises(pb.ReceiptError) as raised:
            self.run(frame, play, **options)
        return str(raised.value)

    def retried(
        self, frame: pd.DataFrame, play: Any, between: Callable[[Outcome], None], **options: Any
    ) -> tuple[Outcome, Outcome]:
        return _retried(
            lambda: self._frame(frame).play.run(play, store=self.store, progress=False, **options), between
        )

    def wipe_store(self) -> None:
        _flush(self.store)


class RedisCluster(Processes):
    """The processes engine with its store and shared limits on a Redis Cluster."""

    name = "redis cluster"


def _flush(url: str) -> None:
    # a cluster's client flushes every master
    with sync_client(url) as client:
        client.flushdb()


# -- outcomes ---------------------------------------------------------------------------------


def _finished(start: Callable[[], Any]) -> Outcome:
    """The outcome of a run (or a cluster job) started and waited for by ``start()``; one that a
    fatal error stopped is ``pb.last_run()``, as a user finds it."""
    try:
        return _outcome(start(), None)
    except pb.RunFatal as exc:
        return _outcome(pb.last_run(), f"RunFatal: {exc}")


def _stopped(start: Callable[[], Awaitable[Any]], when: Callable[[], bool]) -> Outcome:
    """The outcome of a background run ``start()`` gives, stopped once ``when()`` is true."""

    async def main() -> Any:
        run = await start()
        await _until(when)
        run.stop()
        await run
        return run

    return _outcome(asyncio.run(main()), None)


def _retried(start: Callable[[], Any], between: Callable[[Outcome], None]) -> tuple[Outcome, Outcome]:
    """A run ``start()`` gives, ``between`` its outcome, then its retry's: each with its own counters."""
    run = start()
    first = _outcome(run, None)
    between(first)
    again = run.retry()
    outcome = _outcome(again, None)
    outcome.previous = [again.previous.stats.model_dump()]
    return first, outcome


def _outcome(run: Any, fatal: str | None) -> Outcome:
    try:
        result = run.result
    except pb.PlayDefinitionError:  # a cluster job a fatal error stopped: no result to build
        result = None
    if result is not None and not isinstance(result, pd.DataFrame):  # a cluster run's: a Dask DataFrame
        result = result.compute()
    stats = run.stats.model_dump()
    waiting_on = [h.model_dump() for h in run.waiting_on]
    return Outcome(
        result,
        [stats],
        waiting_on,
        run.parked,
        run.waterfalls,
        fatal,
        [] if result is None else [result],
        run.notices,
    )


def _merged(said: list[dict[str, Any]]) -> Outcome:
    """The processes' results as one job's: each row at its most finished status in any of them
    (their values agree: checked here), their counters side by side."""
    refused = [s["refused"] for s in said if "refused" in s]
    assert not refused, f"a process's run was refused before it started: {refused[0]}"
    results = [s["result"] for s in said]
    first = results[0]
    ranks = pd.concat([r["play_status"].map(_RANK) for r in results], axis=1, keys=range(len(results)))
    best = ranks.idxmin(axis=1)
    merged = first.copy()
    for i, result in enumerate(results):
        take = best == i
        merged.loc[take] = result.loc[take]
    done = [
        r[r["play_status"].isin(["ok", "reused"])].drop(columns=["play_status", "play_error"])
        for r in results
    ]
    for other in done[1:]:
        both = done[0].index.intersection(other.index)
        for column in done[0].columns:
            for row in both:
                a, b = done[0].at[row, column], other.at[row, column]
                assert type(a) is type(b) and (a == b or (pd.isna(a) and pd.isna(b))), (row, column, a, b)
    waiting_on = _waiting_on([hold for s in said for hold in s["waiting_on"]])
    parked = merged[merged["play_status"] == "parked"]
    parked = next((s["parked"] for s in said if len(s["parked"]) == len(parked)), said[0]["parked"])
    fatal = next((s["fatal"] for s in said if s["fatal"]), None)
    notices = [note for s in said for note in s["notices"]]
    legs = _legs([s["waterfalls"] for s in said])
    return Outcome(
        merged,
        [s["stats"] for s in said],
        waiting_on,
        parked,
        legs,
        fatal,
        results,
        notices,
        [s.get("previous") for s in said],
    )


def _legs(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Each process's ``run.waterfalls`` summed per leg, as one job's (a process whose rows were all
    reused from the others' memos has an empty table)."""
    shown = [t for t in tables if len(t)]
    if not shown:
        return tables[0]
    keys = ["waterfall", "leg", "tool"]
    return pd.concat(shown).groupby(keys, as_index=False, sort=False).sum()[list(tables[0].columns)]


def _waiting_on(waits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The providers the processes' rows wait on, one per provider: the one that says most (a
    process that only met a hold another set through the shared limits knows no status for it)."""
    best: dict[str, dict[str, Any]] = {}
    for hold in waits:
        seen = best.get(hold["provider"])
        if seen is None or (seen["last_status"] is None and hold["last_status"] is not None):
            best[hold["provider"]] = hold
    return list(best.values())


# -- processes --------------------------------------------------------------------------------


@dataclass
class _Proc:
    popen: Warm
    out: Path


@contextmanager
def _processes(
    scratch: Path,
    frame: pd.DataFrame,
    play: Any,
    options: dict[str, Any],
    n: int,
    *,
    share: str | None = None,
    retry: Path | None = None,
) -> Iterator[list[_Proc]]:
    """Start ``n`` processes running ``play`` over ``frame`` (each started, the play imported);
    any still running at the end is killed.  ``retry``: each retries its run once that file exists."""
    work = Path(tempfile.mkdtemp(dir=scratch))
    script, payload = work / "worker.py", work / "payload.pkl"
    script.write_text(_WORKER)
    with sharing_limits(share) if share else _nothing():
        payload.write_bytes(cloudpickle.dumps((frame, play, options)))
    extra = [str(retry)] if retry is not None else []
    procs = [
        _Proc(warm.start(script, str(payload), str(work / f"out{i}.pkl"), *extra), work / f"out{i}.pkl")
        for i in range(n)
    ]
    try:
        for proc in procs:
            line = proc.popen.readline()
            assert line.strip() == "started", proc.popen.communicate(timeout=60)[1][-3000:]
        yield procs
    finally:
        for proc in procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait(60)


def _setenv(name: str, value: str) -> None:
    os.environ[name] = value


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _said(proc: _Proc) -> dict[str, Any]:
    _, err = proc.popen.communicate(timeout=120)
    assert proc.out.exists(), f"the process said nothing ({proc.popen.returncode}):\n{err[-3000:]}"
    return _load(proc.out)


def _load(path: Path) -> dict[str, Any]:
    with path.open("rb") as said:
        return pickle.load(said)  # type: ignore[no-any-return]


def _kill_when(proc: _Proc, when: Callable[[], bool]) -> None:
    _wait(when)
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(60)


def _wait(when: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not when():
        assert time.monotonic() < deadline, "timed out waiting for the moment to act"
        time.sleep(0.005)


async def _until(when: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not when():
        assert time.monotonic() < deadline, "timed out waiting for the moment to act"
        await asyncio.sleep(0.005)
