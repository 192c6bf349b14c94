"""A run's events as JSON Lines: what ``events=`` keeps and ``run.events()`` gives back.

``events="run.jsonl"`` appends a line per event to that file as the run goes (written at least
every half second, and when the run ends); ``events=True`` keeps them in memory; a callable is
handed each one as it happens (a logger, a queue).  Each event is one JSON object:

- ``"event"``: its kind; ``"at"``: when it happened (epoch seconds); ``"run"``: the run's id and
  ``"execution"``: 0 for the run, 1 for its first ``retry()``...;
- a row is named by ``"row"`` (its index label as JSON has it: a label JSON cannot hold is its
  text) and ``"position"`` (its place in the frame).

The kinds and their fields:

=================  ===============================================================================
``run_started``    ``play``, ``rows`` (rows this execution adds to the run)
``call``           ``row``, ``position``, ``tool``, ``provider``, ``paid`` (sent and paid for now),
                   ``reused`` (answered by a receipt of an earlier run), ``shared`` (by a receipt
                   another row paid for in this run), ``local`` (a free local tool that ran),
                   ``cost``, ``tokens``, ``unpriced`` (its model has no price: ``cost`` says nothing)
``call_failed``    ``row``, ``position``, ``tool``, ``provider``: a request that brought back nothing
                   to keep (a 5xx, a timeout, a 429)
``row_held``       ``row``, ``position``, ``provider``, ``until``, ``status``: the row waits for a
                   provider's hold (``provider`` is ``"sleep"`` in ``ctx.sleep``)
``row_resumed``    ``row``, ``position``: a waiting row runs again
``row_parked``     ``row``, ``position``, ``reason``, ``provider``, ``ready_at``
``row``            ``row``, ``position``, ``status``, ``error``, ``group`` (a failed row's error
                   group), ``copies`` (rows of the same id settled with it), ``calls`` and ``cost``
                   (a reused row: what its memo answered), ``cost_failed``
``hold``           ``provider``, ``until``, ``status``; ``hold_lifted``: ``provider``
``provider_down``  ``provider``, ``error``; ``provider_up``: ``provider``
``key_retired``    ``provider``, ``key`` (its variable and last characters), ``why``, ``left``
``rate``           ``provider``, ``rate``, ``concurrency``
``waterfall``      ``key``, ``tools``, ``outcomes``
``notice``         ``message``, ``lost`` (paid calls whose receipts could not be written)
``progress``       a cluster job's rows and calls so far, as its workers report them (``ok``,
                   ``reused``, ``failed``, ``parked``, ``skipped``, ``calls_executed``,
                   ``calls_reused``, ``calls_shared``, ``calls_failed``, ``cost_spent``): a Dask
                   job's calls are made and counted on its workers, which send counts, not a line
                   per call, and name the rows that failed, parked or wait, not each row that ended
                   ok (its ``row`` lines are those)
``run_finished``   ``stopped``, ``stats`` (``run.stats`` as it ended)
=================  ===============================================================================

The ``call`` lines and the reused ``row`` lines add up to ``run.stats``: its ``calls_executed``
are the lines with ``paid``, ``calls_reused`` those with ``reused`` plus the ``calls`` of reused
rows, ``cost_spent`` the paid lines' ``cost``.  A row's start is not a line (its end is).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from playbook.errors import PlayDefinitionError
from playbook.events import (
    CallFailed,
    CallFinished,
    Event,
    KeyRetired,
    ProviderDown,
    ProviderHoldLifted,
    ProviderHoldSet,
    ProviderUp,
    RateChanged,
    RowDeferred,
    RowFinished,
    RowHeld,
    RowParked,
    RowResumed,
    RowSleeping,
    RunFinished,
    RunNotice,
    RunProgress,
    RunStarted,
    WaterfallFinished,
)
from playbook.runtime.state.reading import RunState

__all__ = ["EventLog", "Sink", "read_events"]

Sink = str | os.PathLike[str] | bool | Callable[[dict[str, Any]], Any]

_logger = logging.getLogger("playbook")

_FLUSH_LINES = 512
_STATUSES = ("ok", "reused", "failed", "parked", "skipped")
_FLUSH_SECONDS = 0.5


class EventLog:
    """Hears a run's events and keeps each as a dict: in a JSON Lines file, in memory, or handed
    to a callable.  ``follow()`` moves it to a retry's state (the same file, the next execution)."""

    def __init__(self, state: RunState, sink: Sink, *, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self.path: Path | None = None
        self.kept: list[dict[str, Any]] | None = None
        self._call: Callable[[dict[str, Any]], Any] | None = None
        if sink is True:
            self.kept = []
        elif isinstance(sink, (str, os.PathLike)):
            self.path = Path(sink).expanduser()
            self._check_writable()
        elif callable(sink):
            self._call = sink
        else:
            raise PlayDefinitionError(
                f"events={sink!r}: give a file to append JSON Lines to (events='run.jsonl'), "
                "True to keep them in memory, or a function to hand each one to"
            )
        self._lines: list[str] = []
        self.broken: str | None = None  # why events stopped being kept (a sink that failed)
        self._calls: dict[str, Any] = {}  # a cluster job's calls, as last said
        self._flushed = 0.0
        self.execution = -1
        self._state: RunState | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.follow(state)

    def __repr__(self) -> str:
        where = self.path or ("memory" if self.kept is not None else "a callable")
        return f"<EventLog to {where}, execution {self.execution}>"

    def _check_writable(self) -> None:
        assert self.path is not None
        try:
            if self.path.is_dir():
                raise PlayDefinitionError(
                    f"events={str(self.path)!r} is a directory: name a file (run.jsonl)"
                )
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8"):
                pass
        except (FileExistsError, NotADirectoryError) as exc:
            raise PlayDefinitionError(
                f"events={str(self.path)!r}: cannot write there: {exc.filename} is a file, not a folder"
            ) from None
        except (OSError, ValueError) as exc:  # ValueError: a name with a NUL in it
            raise PlayDefinitionError(f"events={str(self.path)!r}: cannot write there ({exc})") from None

    def follow(self, state: RunState) -> None:
        """Hear ``state`` from now on: the run's next execution (a retry)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        self.execution += 1
        self._state = state
        self._unsubscribe = state.subscribe(self._heard, kinds=tuple(_SAID))

    def _heard(self, event: Event) -> None:
        # Heard inside the call path (a call's line comes as its receipt is being made): a failure
        # here (the function given raising, a full disk) must cost the run nothing.  The run goes
        # on without its events, and says so once.
        if self.broken is not None:
            return
        try:
            self._keep(event)
        except Exception as exc:
            self._broke(exc)

    def _broke(self, exc: Exception) -> None:
        state = self._state
        assert state is not None
        where = (
            f"the function given as events= raised {type(exc).__name__}: {exc}"
            if self._call is not None
            else f"events could not be written to {self.path}: {exc}"
        )
        self.broken = f"{where}; the run went on without keeping its events from then on"
        _logger.warning("%s", self.broken)
        state.notices.append(self.broken)  # not an event: this is inside the fan-out of one

    def _keep(self, event: Event) -> None:
        state = self._state
        assert state is not None
        said = _SAID[type(event)](event, state)
        if type(event) is RunProgress:
            if said == self._calls:
                return  # a report that moved nothing
            self._calls = said
        line = {"event": said["event"], "at": self._wall(), "run": state.run_id, "execution": self.execution}
        line.update(said)
        if self.kept is not None:
            self.kept.append(line)
        elif self._call is not None:
            self._call(line)
        else:
            # ASCII: a row's text with a lone surrogate (scraped, pasted) is escaped, not a broken line
            self._lines.append(json.dumps(line, default=str))
            now = time.monotonic()
            if (
                len(self._lines) >= _FLUSH_LINES
                or now - self._flushed >= _FLUSH_SECONDS
                or type(event) is RunFinished
            ):
                self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Append the lines not written yet to the file."""
        self._flushed = time.monotonic() if now is None else now
        if not self._lines or self.path is None:
            return
        lines, self._lines = self._lines, []
        data = ("\n".join(lines) + "\n").encode("ascii")
        # One write to a file opened for appending: the lines of two processes given the same
        # file interleave, each whole (a text file's buffer would cut them where it fills).
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)

    def events(self, run: str, execution: int | None) -> list[dict[str, Any]]:
        """The events of run ``run`` (of one ``execution``, or all), as dicts."""
        if self._call is not None:
            raise PlayDefinitionError(
                "run.events(): this run handed its events to the function given as events=; "
                "give events=True (kept in memory) or a file to read them back"
            )
        if self.broken is None:
            try:
                self.flush()
            except OSError as exc:
                self._broke(exc)
        lines: Iterator[dict[str, Any]] = (
            iter(self.kept) if self.kept is not None else read_events(self.path)  # type: ignore[arg-type]
        )
        return [
            line
            for line in lines
            if line.get("run") == run and (execution is None or line.get("execution") == execution)
        ]


def read_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The events in a JSON Lines file ``events=`` wrote (a last line cut short by a crash is left
    out)."""
    with Path(path).open(encoding="utf-8") as lines:
        for text in lines:
            if not text.strip():
                continue
            try:
                yield json.loads(text)
            except ValueError:
                continue  # the line a killed process was writing


def _label(state: RunState, position: int) -> Any:
    return _plain(state.label(position))


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: numpy and pandas scalars as Python's, dates as ISO text, a
    tuple (a MultiIndex label) as a list, anything else as its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (list, tuple, dict)):
        try:
            return _plain(item())
        except (TypeError, ValueError):
            pass
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _row(state: RunState, position: int) -> dict[str, Any]:
    return {"row": _label(state, position), "position": position}


def _call(e: CallFinished, state: RunState) -> dict[str, Any]:
    paid = not e.reused and not e.local
    line: dict[str, Any] = (
        {"event": "call", **_row(state, e.position)} if e.position >= 0 else {"event": "call"}
    )
    line.update(
        tool=e.tool,
        provider=e.provider,
        paid=paid,
        reused=e.reused and not e.shared,
        shared=e.reused and e.shared,
        local=e.local,
        cost=e.cost,
        tokens=e.tokens,
        unpriced=e.unpriced,
    )
    return line


def _call_failed(e: CallFailed, state: RunState) -> dict[str, Any]:
    line: dict[str, Any] = (
        {"event": "call_failed", **_row(state, e.position)} if e.position >= 0 else {"event": "call_failed"}
    )
    line.update(tool=e.tool, provider=e.provider)
    return line


def _row_finished(e: RowFinished, state: RunState) -> dict[str, Any]:
    return {
        "event": "row",
        **_row(state, e.position),
        "status": e.status,
        "error": e.error,
        "group": e.group,
        "copies": e.copies,
        "calls": e.calls,
        "cost": e.cost,
        "cost_failed": e.cost_failed,
    }


_SAID: dict[type, Callable[[Any, RunState], dict[str, Any]]] = {
    RunStarted: lambda e, s: {"event": "run_started", "play": e.play, "rows": e.total},
    CallFinished: _call,
    CallFailed: _call_failed,
    RowFinished: _row_finished,
    RowHeld: lambda e, s: {
        "event": "row_held",
        **_row(s, e.position),
        "provider": e.provider,
        "until": e.until,
        "status": e.status,
    },
    RowSleeping: lambda e, s: {
        "event": "row_held",
        **_row(s, e.position),
        "provider": "sleep",
        "until": e.until,
        "status": None,
    },
    RowResumed: lambda e, s: {"event": "row_resumed", **_row(s, e.position)},
    RowDeferred: lambda e, s: {"event": "row_deferred", **_row(s, e.position)},
    RowParked: lambda e, s: {
        "event": "row_parked",
        **_row(s, e.position),
        "reason": e.reason,
        "provider": e.provider,
        "ready_at": e.ready_at,
    },
    ProviderHoldSet: lambda e, s: {
        "event": "hold",
        "provider": e.provider,
        "until": e.until,
        "status": e.status,
    },
    ProviderHoldLifted: lambda e, s: {"event": "hold_lifted", "provider": e.provider},
    ProviderDown: lambda e, s: {"event": "provider_down", "provider": e.provider, "error": e.error},
    ProviderUp: lambda e, s: {"event": "provider_up", "provider": e.provider},
    KeyRetired: lambda e, s: {
        "event": "key_retired",
        "provider": e.provider,
        "key": e.key,
        "why": e.why,
        "left": e.left,
    },
    RateChanged: lambda e, s: {
        "event": "rate",
        "provider": e.provider,
        "rate": e.rate,
        "concurrency": e.concurrency,
    },
    WaterfallFinished: lambda e, s: {
        "event": "waterfall",
        "key": e.key,
        "tools": list(e.tools),
        "outcomes": list(e.outcomes),
    },
    RunNotice: lambda e, s: {"event": "notice", "message": e.message, "lost": e.lost},
    RunProgress: lambda e, s: {
        "event": "progress",
        **{status: getattr(s, status) for status in _STATUSES},
        "calls_executed": s.calls_executed,
        "calls_reused": s.calls_reused,
        "calls_shared": s.calls_shared,
        "calls_failed": s.calls_failed,
        "cost_spent": s.cost_spent,
    },
    RunFinished: lambda e, s: {
        "event": "run_finished",
        "stopped": e.stopped,
        "stats": s.stats().model_dump(),
    },
}
