"""Where ``.play`` comes from on each kind of frame: :func:`register`, which ``import playbook`` calls.

pandas has the accessor at once.  Polars and Dask have no plugin entry point for accessors, and
importing them to register ours would cost every playbook user their import time (Polars alone
is about 0.2 s): their ``.play`` is registered at once when they are imported already, else right
after their first import (:func:`~playbook._internal.when_imported.when_imported`).  Their
frontends are imported only then, so a pandas user loads neither.
"""

from __future__ import annotations

import pandas as pd

from playbook._internal.when_imported import when_imported
from playbook.frontends.pandas import PlayAccessor

__all__ = ["register"]


def register() -> None:
    """Give pandas, Polars and Dask frames their ``.play`` (once, however often it is called)."""
    if pd.DataFrame.__dict__.get("play") is not None:
        return  # pandas would warn that the accessor replaces itself
    pd.api.extensions.register_dataframe_accessor("play")(PlayAccessor)
    when_imported("polars", _polars)
    when_imported("dask.dataframe", _dask)


def _polars() -> None:
    from playbook.frontends.polars import register

    register()


def _dask() -> None:
    from playbook.frontends.dask import register

    register()
