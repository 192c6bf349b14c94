"""Estimates: a pilot on a sample of the rows, projected over the frame.

``pilot`` runs the play for real on the sample and logs each row's calls, ``distinct`` counts the
calls the rows left share, ``projection`` projects the pilot over the rows left (an ``Estimate``),
and ``words`` is what an estimate says beside its figures.

On top of the runtime: it runs the pilot through ``runtime.run`` like any run, hears its calls
through ``calls.observed`` and reads ``rows``; nothing in the runtime imports it.
"""
