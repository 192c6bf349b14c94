"""Where users start a run: the pandas, Polars and Dask frames' ``.play``, the ``%%play`` magic and
the command line.  Each takes the run options declared once in
:class:`~playbook.runtime.options.RunOptions` (:mod:`.signature` spells them for each)."""

from playbook.frontends.registration import register

__all__ = ["register"]
