"""Views of a run.  They read a ``RunState`` (its events and its read API) and nothing else of the
runtime, which knows nothing of them: the accessor attaches one to each run."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from playbook.runtime.state.reading import RunState

__all__ = ["Controls", "attach_view"]


class Controls(NamedTuple):
    """What a view's buttons may do to its run."""

    stop: Callable[[], None]
    retry: Callable[[str], Any]  # retry the rows with this status: "parked" or "failed"


def attach_view(
    state: RunState,
    progress: Any,
    *,
    background: bool = False,
    controls: Controls | None = None,
    awaited: bool = False,
) -> Any:
    """Subscribe the view ``progress`` asks for; returns it (or ``None`` for no view).

    ``"auto"`` picks the widget in a notebook (a Jupyter kernel, marimo), else text; for a run that
    is awaited (``amap``/``arun``), text only when stderr is a terminal.  ``True`` is ``"auto"``,
    except that an awaited run shows text wherever stderr goes.
    """
    if progress is False:
        return None
    if progress in ("widget", "auto", True) and _in_notebook():
        from playbook.ui.widget import WidgetView

        return WidgetView(state, background=background, controls=controls)
    if progress == "widget":  # asked for where no notebook can show it: a script, a terminal's IPython
        logging.getLogger("playbook").warning(
            'progress="widget" shows in a notebook (Jupyter, marimo); here the run shows its text bar'
        )
        return _text(state)
    # A blocking map() outside a kernel keeps its text even when stderr is a file: a script run by
    # cron or CI is watched through its log, and the bar's last state and the summary (rows parked,
    # providers down) are what someone reads there afterwards; tqdm writes to such logs too.  An
    # awaited run is a server's or an app's: their stderr is shared by every request and carries
    # the access log, so a bar per request would garble it; they have the Run's counters instead.
    if awaited and progress == "auto" and not _is_terminal(sys.stderr):
        return None
    return _text(state)


def _text(state: RunState) -> Any:
    from playbook.ui.text import TextView

    return TextView(state)


def _in_notebook() -> bool:
    from playbook.ui.widget import in_notebook

    return in_notebook()


def _is_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty (a replaced stream), or a closed file
        return False
