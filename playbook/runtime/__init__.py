"""The row runtime: options, scheduler (MapRun), run state and the Run handle."""

from .options import RunOptions
from .run import Run, last_run
from .scheduler import MapRun
from .state import RunState

__all__ = ["MapRun", "Run", "RunOptions", "RunState", "last_run"]
