"""Scheduling: the scheduler and its workers, the waiting queue, one row's attempt and how it ends.

``scheduler`` wires the pieces and runs executions, ``workers`` admits rows to places, ``attempt``
runs one row once, ``outcomes`` turns how it ended into the table and the run's events,
``retry_queue`` keeps rows stepped aside until their time, and ``recovery`` brings back rows
parked on a down provider.

The top of the row runtime: it imports ``calls`` (the scope, the context, the level), ``state``
(the run's state and what it reads of providers), ``rows`` and ``runtime.options``; only
``runtime.run`` (the ``Run`` handle) imports it.
"""
