"""Views of a run.  They read a ``RunState`` (its events and its read API) and nothing else of the
runtime, which knows nothing of them: the accessor attaches one to each run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..runtime.state import RunState

__all__ = ["Controls", "attach_view"]


class Controls(NamedTuple):
    """What a view's buttons may do to its run."""

    stop: Callable[[], None]
    retry: Callable[[str], Any]  # retry the rows with this status: "parked" or "failed"


def attach_view(state: RunState, progress: Any, *, background: bool = False, controls: Controls | None = None) -> Any:
    """Subscribe the view ``progress`` asks for; returns it (or ``None`` for no view).

    ``"auto"`` (or True) picks the widget inside a Jupyter kernel with ipywidgets, else text.
    """
    if progress is False:
        return None
    if progress == "widget" or (progress in ("auto", True) and _in_kernel()):
        from .widget import WidgetView

        return WidgetView(state, background=background, controls=controls)
    from .text import TextView

    return TextView(state)


def _in_kernel() -> bool:
    from .widget import in_kernel

    return in_kernel()
