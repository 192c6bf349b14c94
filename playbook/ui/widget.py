"""The live view of a run in Jupyter: an ipywidgets panel refreshed at most 10 times a second.

It shows a progress bar, the counters and the providers (state, rate, in flight, 429s, hold
with a countdown, rows waiting), and has Stop / Retry parked / Retry failed buttons (they act on
a background run: a blocking cell keeps the kernel busy until it ends).  When the run finishes,
the panel is replaced by the run's static HTML summary, which saved and exported notebooks keep.
A run over in less than ``DELAY`` seconds shows only that summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any

from ..models import Event, ProviderHoldLifted, ProviderHoldSet, RunFinished, RunStarted

if TYPE_CHECKING:
    from ..runtime.run import Run

__all__ = ["DELAY", "WidgetView", "in_kernel"]

_INTERVAL = 0.1  # at most 10 refreshes a second
DELAY = 0.5  # seconds a run goes on before its live panel appears


def in_kernel() -> bool:
    """True inside a Jupyter kernel that can show widgets."""
    try:
        from IPython import get_ipython

        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class WidgetView:
    """Subscribes to a run's state; renders counters and providers, throttled and batched."""

    def __init__(self, run: Run, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._run = run
        self._clock = clock
        self._last = 0.0
        self._started = 0.0
        self.panel: Any = None  # built once the run has gone on for DELAY seconds
        self.handle: Any = None
        self._timer: Any = None
        # Redrawn on a timer, not per row: only the events that change what it shows call it.
        self.unsubscribe = run.state.subscribe(self.on_event, kinds=(RunStarted, RunFinished, ProviderHoldSet, ProviderHoldLifted))

    def _build(self) -> None:
        import ipywidgets as w
        from IPython.display import display

        run = self._run
        self.bar = w.IntProgress(min=0, max=max(run.state.total, 1), description=escape(run._maprun.play.name))
        self.body = w.HTML()
        self.stop = w.Button(description="Stop", icon="stop")
        self.retry_parked = w.Button(description="Retry parked")
        self.retry_failed = w.Button(description="Retry failed")
        self.stop.on_click(lambda _: run.stop())
        self.retry_parked.on_click(lambda _: self._retry("parked"))
        self.retry_failed.on_click(lambda _: self._retry("failed"))
        self.panel = w.VBox([w.HBox([self.bar, self.stop, self.retry_parked, self.retry_failed]), self.body])
        self.handle = display(self.panel, display_id=True)

    def _retry(self, status: str) -> None:
        self._run.retry(statuses=(status,))

    def on_event(self, event: Event) -> None:
        from IPython.display import HTML, display

        kind = type(event)
        if kind is RunFinished:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            summary = HTML(self._run._repr_html_())
            if self.handle is not None:
                self.handle.update(summary)
            else:  # over before the panel was due: just the summary
                self.handle = display(summary, display_id=True)
            return
        if kind is RunStarted:
            self._started = self._clock()
            if self._timer is None:
                self._tick()
        elif self.panel is not None:
            self._render()

    def _tick(self) -> None:
        """Redraw at most 10 times a second while the run goes (the countdowns move too).  Like
        tqdm's ``delay``, the panel only appears once the run has lasted DELAY seconds: a run
        answered from its receipts in a blink shows its summary and nothing else."""
        import asyncio

        now = self._clock()
        if self.panel is None and now - self._started >= DELAY:
            self._build()
        if self.panel is not None and now - self._last >= _INTERVAL:
            self._render()
        try:
            self._timer = asyncio.get_running_loop().call_later(_INTERVAL, self._tick)
        except RuntimeError:  # no loop running: nothing to tick on
            self._timer = None

    def _render(self) -> None:
        self._last = self._clock()
        s = self._run.state
        done = s.done
        elapsed = s.elapsed
        rate = done / elapsed if elapsed else 0.0
        eta = (s.total - done) / rate if rate and s.finished is None else 0.0
        lines = [
            f"<b>{escape(s.play)}</b> · {done:,}/{s.total:,} rows · {elapsed:.1f}s"
            + (f" · ETA {eta:.0f}s" if eta else "")
            + f" · {rate:,.0f} rows/s",
            f"ok {s.ok:,} · reused {s.reused:,} · failed {s.failed:,} · in flight {s.in_flight:,} · held {s.held:,} · "
            f"parked {s.parked:,} · calls {s.calls_executed:,} paid, {s.calls_reused:,} reused · "
            f"cost {s.cost_spent:g} spent, {s.cost_saved:g} saved",
        ]
        now = time.time()
        for name, p in s.providers.items():
            hold = f"held {p.hold_wall - now:.0f}s more (HTTP {p.last_status})" if p.held else "open"
            rate_text = "unlimited" if p.rate is None else f"{p.rate:.3g}/s"
            lines.append(f"{escape(name)}: {hold} · {rate_text} · {p.in_flight} in flight · {p.refused} 429s")
        with self.panel.hold_sync():  # one batch of comm messages per refresh
            self.bar.max = max(s.total, 1)
            self.bar.value = done
            self.body.value = "<br>".join(lines)
