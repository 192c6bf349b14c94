"""The live view of a run in a notebook: one anywidget panel refreshed at most 10 times a second.

It shows a header (play, status, elapsed, ETA, rows/s), the progress bar (the rows stacked by
status: ok, reused, failed, held, parked, skipped, then not done yet), the counters, the providers
(open, held with a countdown, or down with why and the next probe; rate and the calls in flight it
allows, in flight, 429s, rows waiting) and a small chart of each over the run, the parked rows
grouped by why, provider and when they are ready, the errors grouped by kind (one bug, one line) and
the waterfall legs.  A background run's panel has Stop / Retry parked / Retry failed buttons; a
blocking run keeps the kernel busy, so a click would only be handled after it: its panel has none
(interrupting the kernel stops it).

The panel (:class:`~playbook.ui.panel.Panel`) keeps each part's HTML in a trait of its own: the
status changes on every refresh, the capped tables at most twice a second, the charts once a
second (never with the tables), and a refresh sends the traits that changed as one message of
bounded size, so a million-row run costs the browser what a ten-row one does.  When the run
finishes, the panel is replaced by the run's static HTML summary, which saved and exported
notebooks keep.  A blocking run over in less than ``DELAY`` seconds shows only that summary.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import weakref
from collections.abc import Callable
from html import escape
from typing import Any

from playbook.events import (
    Event,
    ProviderDown,
    ProviderHoldLifted,
    ProviderHoldSet,
    ProviderUp,
    RunFinished,
    RunStarted,
)
from playbook.runtime.state.reading import RunState
from playbook.ui import Controls
from playbook.ui.html import (
    LIMIT,
    counters_table,
    errors_table,
    legs_table,
    parked_table,
    per_second,
    provider_pictures,
    providers_table,
    rows_picture,
    run_html,
    workers_table,
)
from playbook.ui.tally import KINDS as TALLY_KINDS
from playbook.ui.tally import Tally

__all__ = ["DELAY", "WidgetView", "in_kernel", "in_marimo", "in_notebook", "printable"]

_logger = logging.getLogger("playbook")

_INTERVAL = 0.1  # at most 10 refreshes a second
_TABLES_INTERVAL = 0.5
_PICTURES_INTERVAL = 1.0
DELAY = 0.5  # seconds a run goes on before its live panel appears
_KINDS = (
    RunStarted,
    RunFinished,
    ProviderHoldSet,
    ProviderHoldLifted,
    ProviderDown,
    ProviderUp,
)  # not per row


def in_kernel() -> bool:
    """True inside a Jupyter kernel that can show widgets."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def in_marimo() -> bool:
    """True in a marimo notebook (``marimo edit`` or ``marimo run``), not a script that imports
    marimo.  marimo is not imported here: it is only asked once its notebook has imported it."""
    marimo = sys.modules.get("marimo")
    return marimo is not None and bool(marimo.running_in_notebook())


def in_notebook() -> bool:
    """True where the live panel can show: a Jupyter kernel or a marimo notebook."""
    return in_kernel() or in_marimo()


class WidgetView:
    """Subscribes to a run's state; renders counters, providers and tables, throttled and batched.

    ``controls``: what its buttons do (a background run's); ``None``: no buttons."""

    def __init__(
        self,
        state: RunState,
        *,
        background: bool = False,
        controls: Controls | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        # The state holds this view (its listeners): a strong reference back would make a cycle,
        # and a finished run's rows would wait for the cyclic garbage collector.
        self._ref = weakref.ref(state)
        self._background = background
        self._controls = controls
        self._clock = clock
        self._wall = wall  # hold deadlines are epoch seconds: the countdown reads this clock
        self._last = self._last_tables = self._last_pictures = 0.0
        self._started = 0.0
        self._drawn = -1  # the tally version the tables show
        self._ended = False  # the panel shows a finished run
        self.panel: Any = None  # built once the run has gone on for DELAY seconds
        self.handle: Any = None
        self._timer: Any = None
        self.broken: str | None = None  # why the view stopped, if it did
        self._unsubscribe: list[Any] = []
        self.follow(state)
        self._replace_in_cell()
        if background:
            # The cell that starts a background run ends at once: the panel must be shown now,
            # in that cell.  Later output would land wherever the kernel happens to be then;
            # widget updates and the final summary (by display id) find it anywhere.
            self._build()

    def _replace_in_cell(self) -> None:
        """A cell run again clears its output, and with it the panels of the background runs it
        started the time before: those runs are stopped (as their Stop buttons would), rather
        than left paying with nothing on the page to stop them.  What they finished is saved; a
        rerun resumes them.  Runs the same execution of the cell started are its own: left be."""
        here = _cell()
        if here is None:
            return
        cell, execution = here
        before = _BACKGROUND.get(cell)
        # marimo's execution is an object kept here (so its id is not reused); Jupyter's a request id.
        if before is None or not (
            before[0] is execution or (isinstance(execution, str) and before[0] == execution)
        ):
            for view in list(before[1]) if before is not None else ():
                view._stopped_by_its_cell()
            before = _BACKGROUND[cell] = (execution, weakref.WeakSet())
        if self._background:
            before[1].add(self)

    def _stopped_by_its_cell(self) -> None:
        earlier = self._ref()
        if self._controls is None or earlier is None or earlier.finished is not None:
            return
        _logger.warning(
            "a background run of %r started by this cell was still going: stopped, as its panel went "
            "with the cell's output (what it finished is saved; running it again resumes it)",
            earlier.play,
        )
        earlier.notices.append("stopped: its cell was run again")
        self._controls.stop()

    @property
    def _state(self) -> RunState:
        return _alive(self._ref)

    def unsubscribe(self) -> None:
        for undo in self._unsubscribe:
            undo()

    def follow(self, state: RunState) -> None:
        """Show ``state`` from now on (a retry's run, with its own counters) where the run before
        was shown."""
        self.unsubscribe()
        self._ref = ref = weakref.ref(state)  # not self: the tally would hold the view in a cycle
        self.tally = Tally(lambda position: _alive(ref).label(position))
        # Redrawn on a timer, not per row: only the events that change what it shows call it.
        self._unsubscribe = [
            state.subscribe(self.on_event, kinds=_KINDS),
            state.subscribe(self.tally.on_event, kinds=TALLY_KINDS, every_row=False),
        ]

    def _build(self) -> None:
        """Show the live panel: the buttons, the status (with the bar), the charts, the tables."""
        from playbook.ui.panel import BUTTONS, Panel

        # A blocking run keeps the kernel busy: a click would be handled only once it is over.
        # Its panel has no buttons (interrupting the kernel stops it); a background run's has.
        controls = self._controls
        self.panel = Panel(buttons=list(BUTTONS) if controls is not None else [])
        if controls is not None:
            # The panel holds the run: it stays on the page after the run, to retry it.
            self.panel.on_press("stop", controls.stop)
            self.panel.on_press("retry_parked", lambda: self._retry(controls, "parked"))
            self.panel.on_press("retry_failed", lambda: self._retry(controls, "failed"))
        if self.handle is None:
            self.handle = _display(self.panel)
        else:  # a retry of a run that showed only its summary: the panel takes its place
            self.handle.update(self.panel)

    def _finish(self, summary: str) -> None:
        """A blocking run: replace the panel's output by the static summary, and let the live
        widget go (it holds the run, and a kernel keeps every widget it ever made until it is
        closed).  A background run: the panel says the outcome itself and keeps its Retry buttons
        (a parked row is retried after its hold, long after the run ended); its output holds the
        summary beside it, which a front end without the widget (a saved notebook) shows."""
        self._ended = True
        if not self._background:
            # The cell that showed the panel is still running, so every front end applies the
            # update: nothing of the panel stays on the page.
            self.handle.update(_html(summary))
            _close(self.panel)
            self.panel = None
            return
        # Rows the runs before left failed or parked are retried by these buttons too, not only this run's.
        state = self._state
        with self.panel.hold_sync():
            self.panel.buttons = ["retry_parked", "retry_failed"]
            self.panel.disabled = [
                name
                for name, status in (("retry_parked", "parked"), ("retry_failed", "failed"))
                if not state.can_retry(status)
            ]
            self.panel.status = self.panel.pictures = self.panel.tables = ""
            self.panel.summary = summary
        self.handle.update(_with_summary(self.panel, summary), raw=True)

    def _retry(self, controls: Controls, status: str) -> None:
        controls.retry(status)
        if self.panel is not None and self._state.running and self.broken is None:
            try:
                self._render()
            except Exception as exc:
                self._broke(exc)

    def on_event(self, event: Event) -> None:
        if self.broken is not None:
            return
        try:
            self._on(event)
        except Exception as exc:  # a view must never cost its run anything
            self._broke(exc)

    def _on(self, event: Event) -> None:
        kind = type(event)
        if kind is RunFinished:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            summary = printable(run_html(self._state, self.tally))
            if self.panel is not None:
                self._finish(summary)
            elif self.handle is None:  # over before the panel was due: just the summary
                self.handle = _display(_html(summary))
            else:  # a retry of a run that showed only its summary
                self.handle.update(_html(summary))
            return
        if kind is RunStarted:
            self._started = self._clock()
            if self.panel is not None and self._ended:
                # A background run, run again (Retry): the same panel goes live again.  A new
                # widget could not be shown from here in every front end (marimo makes one only
                # while a cell runs), and this one is where the user clicked.
                from playbook.ui.panel import BUTTONS

                with self.panel.hold_sync():
                    self.panel.summary = ""
                    self.panel.buttons = list(BUTTONS)
                    self.panel.disabled = []
                self._ended = False
            if self._timer is None:
                self._tick()
        elif self.panel is not None:
            self._render()

    def _broke(self, exc: Exception) -> None:
        """The view failed (a front end that cannot take what it was sent): it stops, the run goes on."""
        self.broken = f"the live panel stopped: {type(exc).__name__}: {exc}; the run goes on without it"
        _logger.warning("%s", self.broken)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(Exception):
            self._state.notices.append(self.broken)

    def _tick(self) -> None:
        """Redraw at most 10 times a second while the run goes (the countdowns move too).  Like
        tqdm's ``delay``, the panel only appears once the run has lasted DELAY seconds: a run
        answered from its receipts in a blink shows its summary and nothing else."""
        import asyncio

        if self.broken is not None:
            return
        now = self._clock()
        try:
            if self.panel is None and now - self._started >= DELAY:
                self._build()
            if self.panel is not None and now - self._last >= _INTERVAL:
                self._render()
        except Exception as exc:  # a view must never cost its run anything
            self._broke(exc)
            return
        try:
            self._timer = asyncio.get_running_loop().call_later(_INTERVAL, self._tick)
        except RuntimeError:  # no loop running: nothing to tick on
            self._timer = None

    def _render(self) -> None:
        now = self._last = self._clock()
        s = self._state
        done = s.done
        elapsed = s.elapsed
        rate = (done - s.skipped) / elapsed if elapsed else 0.0  # a stop's skipped rows did not run
        eta = (s.total - done) / rate if rate and s.finished is None else 0.0
        status = (
            "stopping"
            if s.stopping and s.finished is None
            else "running"
            if s.finished is None
            else "finished"
        )
        head = (
            f"<b>{escape(s.play)}</b> · {status} · {done:,}/{s.total:,} rows · {elapsed:.1f}s"
            + (f" · ETA {eta:.0f}s" if eta else "")
            + f" · {per_second(rate)} rows/s"
        )
        tally = self.tally
        panel = self.panel
        with panel.hold_sync():  # one message per refresh
            providers = providers_table(
                s.provider_views(), tally.waiting(), now=self._wall(), down_since=s.down_since
            )
            panel.status = printable(
                head
                + f"<div>{rows_picture(s)}</div>"
                + counters_table(s)
                + providers
                + workers_table(s.workers())
            )
            if panel.buttons:
                disabled = [
                    name
                    for name, off in (
                        ("stop", s.finished is not None),
                        ("retry_parked", not tally.parked),
                        ("retry_failed", not tally.failed),
                    )
                    if off
                ]
                if disabled != panel.disabled:
                    panel.disabled = disabled
            # The tables cost a sort of the error groups: redrawn when they changed, twice a second at most.
            if (tally.version != self._drawn or s.waterfalls) and now - self._last_tables >= _TABLES_INTERVAL:
                self._drawn, self._last_tables = tally.version, now
                panel.tables = printable(
                    parked_table(tally.parked_summary(LIMIT), len(tally.parked_groups), s.provider_views())
                    + errors_table(tally.error_groups(LIMIT), tally.kinds)
                    + legs_table(s)
                )
            elif now - self._last_pictures >= _PICTURES_INTERVAL:
                # not with the tables: one refresh stays small
                self._last_pictures = now
                panel.pictures = printable(provider_pictures(s.history()))


def _alive(ref: weakref.ref[RunState]) -> RunState:
    state = ref()
    if state is None:  # pragma: no cover - the run owns this view: it cannot outlive it
        raise RuntimeError("the run of this view is gone")
    return state


# By notebook cell: its last execution, and the views of the background runs that execution started.
_BACKGROUND: dict[str, tuple[object, weakref.WeakSet[WidgetView]]] = {}


def _cell() -> tuple[str, object] | None:
    """The notebook cell running now and this execution of it: marimo's cell id and execution
    context, or the ``cellId`` JupyterLab, Notebook 7 and VS Code send with an execute request and
    that request's id; None where there is none (a script, a front end that names no cell)."""
    if in_marimo():
        try:
            from marimo._runtime.context import get_context

            running = get_context().execution_context
        except Exception:  # no context (a thread of our own), or a marimo that moved it
            return None
        return None if running is None else (str(running.cell_id), running)
    try:
        from IPython import get_ipython

        parent = get_ipython().get_parent()
    except Exception:  # no shell, or one without parents
        return None
    if not isinstance(parent, dict):
        return None
    cell = parent.get("metadata", {}).get("cellId")
    execution = parent.get("header", {}).get("msg_id")
    return (cell, execution) if isinstance(cell, str) and cell and execution else None


def _display(obj: Any) -> Any:
    """Show ``obj`` in the cell's output; returns the handle that updates it in place."""
    if in_marimo():
        return _MarimoOutput(obj)
    from IPython.display import display

    show: Callable[..., Any] = display  # IPython's display is untyped
    return show(obj, display_id=True)


def _html(text: str) -> Any:
    if in_marimo():
        import marimo

        return marimo.Html(text)
    from IPython.display import HTML

    html: Callable[[str], Any] = HTML
    return html(text)


class _MarimoOutput:
    """The output of the marimo cell that showed the panel: a blocking run's summary takes the
    panel's place there.  Once that cell has ended (a background run), marimo's output is another
    cell's or none, and is left alone: the panel then says the run's end itself (its summary part)."""

    def __init__(self, obj: Any) -> None:
        self.cell = _marimo_cell()
        self.update(obj)

    def update(self, obj: Any) -> None:
        import marimo

        if self.cell is not None and _marimo_cell() == self.cell:
            marimo.output.replace(obj)


def _marimo_cell() -> str | None:
    """The id of the marimo cell running now, or None."""
    try:
        from marimo._runtime.context import get_context

        running = get_context().execution_context
    except Exception:  # no context (a thread of our own), or a marimo that moved it
        return None
    return None if running is None else str(running.cell_id)


def printable(html: str) -> str:
    """``html`` with each lone surrogate (text scraped or decoded with ``surrogateescape``) made
    U+FFFD: a front end's messages are UTF-8, which cannot carry one."""
    try:
        html.encode("utf-8")
    except UnicodeEncodeError:
        return html.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return html


def _with_summary(panel: Any, summary: str) -> dict[str, Any]:
    """The panel's output, the widget and the static summary together: a front end that has
    the widget shows it, one that has not (a saved or exported notebook) the summary."""
    shown = panel._repr_mimebundle_() or {}
    bundle: dict[str, Any] = dict(
        shown[0] if isinstance(shown, tuple) else shown
    )  # (data, metadata), or data
    bundle["text/html"] = summary
    return bundle


def _close(panel: Any) -> None:
    """Close the panel with its layout, a widget of its own."""
    panel.layout.close()
    panel.close()
