"""The row runtime: a run's options, the ``Run`` handle, and its rooms by concern.

``options`` declares and checks a run's options; ``run`` is the handle a user holds.  The rooms,
each importing only those below it (a test holds them to it)::

    estimate    a pilot on a sample of the rows, projected over the frame
    schedule    the scheduler, its workers, one row's attempt and how it ends
    calls       what ctx does for a row: the call pipeline, batching, jobs, sub-plays
    state       the run's state from its events, fanned out to views, read through RunState
    rows        the table of every row's state, frames, row memos, failures grouped

``run`` sits between ``estimate`` and ``schedule``, ``options`` between ``schedule`` and
``calls``.  Views import only ``state.reading``; the runtime imports no view.
"""

from playbook.runtime.options import RunOptions
from playbook.runtime.run import Run, last_run
from playbook.runtime.schedule.scheduler import Scheduler
from playbook.runtime.state.reading import RunState

__all__ = ["Run", "RunOptions", "RunState", "Scheduler", "last_run"]
