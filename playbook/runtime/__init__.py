"""The row runtime: options, the scheduler and its parts, the run state and the Run handle."""

from .options import RunOptions
from .run import Run, last_run
from .scheduler import Scheduler
from .state import RunState

__all__ = ["Run", "RunOptions", "RunState", "Scheduler", "last_run"]
