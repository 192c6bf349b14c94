"""The row runtime: options, the scheduler and its parts, the run state and the Run handle."""

from playbook.runtime.options import RunOptions
from playbook.runtime.run import Run, last_run
from playbook.runtime.schedule.scheduler import Scheduler
from playbook.runtime.state.reading import RunState

__all__ = ["Run", "RunOptions", "RunState", "Scheduler", "last_run"]
