"""The run's state: what a run has done so far, as its events tell it, and what it reads of providers.

``reducer`` holds the counters and how each event changes them, ``fanout`` hands each event to the
views once counted, and ``reading`` holds :class:`~playbook.runtime.state.reading.RunState`, the one
read API views import.  ``legs`` counts waterfall legs, ``timeline`` keeps each provider over the run
and ``upstream`` is everything the runtime reads of a provider.  This room imports ``rows`` (the row
table the read API reads) and nothing else of the runtime; ``calls`` and ``schedule`` import it.
"""
