"""Views of a run.  They subscribe to a run's events; the runtime knows nothing of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime.run import Run

__all__ = ["attach_view"]


def attach_view(run: Run, progress: Any) -> Any:
    """Subscribe the view ``progress`` asks for; returns it (or ``None`` for no view).

    ``"auto"`` (or True) picks the widget inside a Jupyter kernel with ipywidgets, else text.
    """
    if progress is False:
        return None
    if progress == "widget" or (progress in ("auto", True) and _in_kernel()):
        from .widget import WidgetView

        return WidgetView(run)
    from .text import TextView

    return TextView(run.state)


def _in_kernel() -> bool:
    from .widget import in_kernel

    return in_kernel()
