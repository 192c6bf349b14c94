"""Rows: the table of every row's state, the frames a run reads and returns, row memos, failures grouped.

``table`` holds each row's status, output, error, attempts and wait budgets (:class:`RowTable`),
``frames`` how rows look to a play and how its return values become the result frame, ``memos``
the row memos a rerun reuses, ``grouping`` failed rows grouped by bug.  The bottom room of the
runtime: it imports no other part of it, and ``state``, ``calls``, ``schedule`` and ``estimate``
import it.
"""
