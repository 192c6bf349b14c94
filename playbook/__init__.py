"""playbook: run async plays that call paid, rate-limited tools over the rows of a DataFrame.

Every tool result is a durable receipt on disk, so a rerun is a resume and nothing is paid for
twice.  Import everything from here::

    import playbook as pb
"""

from . import accessor as _accessor  # registers the DataFrame ``.play`` accessor
from . import demo
from . import polars_frames as _polars_frames  # noqa: F401 - registers pl.DataFrame.play, now or once Polars is imported
from .cluster import ClusterRun  # registers ddf.play, now or once dask.dataframe is imported
from .errors import (
    PlaybookError,
    PlayDefinitionError,
    ProviderExhausted,
    ProviderUnavailable,
    ReceiptError,
    RunFatal,
    ToolError,
)
from .models import ProviderHold, Receipt, RunStats
from .plays import Play, play
from .providers import Provider
from .runtime import Run, last_run
from .runtime.context import Context
from .store import ReceiptStore
from .store.fixtures import Fixtures, fixtures
from .tools import Secret, Tool, http_tool, llm_tool, secret, tool

__version__ = "0.1.0"

__all__ = [
    "ClusterRun",
    "Context",
    "Fixtures",
    "Play",
    "PlayDefinitionError",
    "PlaybookError",
    "Provider",
    "ProviderExhausted",
    "ProviderHold",
    "ProviderUnavailable",
    "Receipt",
    "ReceiptError",
    "ReceiptStore",
    "Run",
    "RunFatal",
    "RunStats",
    "Secret",
    "Tool",
    "ToolError",
    "demo",
    "fixtures",
    "http_tool",
    "last_run",
    "llm_tool",
    "load_ipython_extension",
    "play",
    "secret",
    "tool",
]

del _accessor


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext playbook``: registers the ``%%play`` cell magic."""
    from .magic import PlayMagics  # IPython is imported only here: the runtime stays Jupyter-free

    ipython.register_magics(PlayMagics)  # type: ignore[attr-defined]
