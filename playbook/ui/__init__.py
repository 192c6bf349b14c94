"""Views of a run.  They subscribe to a run's events; the runtime knows nothing of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime.state import RunState

__all__ = ["attach_view"]


def attach_view(state: RunState, progress: Any) -> Any:
    """Subscribe the view ``progress`` asks for; returns it (or ``None`` for no view)."""
    if progress is False:
        return None
    from .text import TextView

    return TextView(state)
