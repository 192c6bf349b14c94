"""Calls: what ``ctx`` does for a row, and what its calls may use of the run.

``context`` is the ``ctx`` a play is handed and ``ledger`` what the runtime keeps behind it;
``pipeline`` is what ``await ctx.tool(...)`` does (``recording`` and ``kept_errors`` its last
steps), ``batching`` and ``jobs`` its routes for batch tools and batch jobs, ``subplays`` a play
run as a step; ``scope`` is what the calls may use of the run, ``level`` the number of rows in
flight their waits set, and ``observed`` what a watcher of the calls (a pilot) hears.

Below ``schedule``, above ``state`` and ``rows``: it imports ``state`` (``upstream``, what the
runtime reads of a provider) and ``rows`` (the table, frames and memos), never ``schedule`` or
``estimate``; ``schedule``, ``options`` and ``estimate`` import it.
"""
