"""playbook: run async plays that call paid, rate-limited tools over the rows of a DataFrame.

Every tool result is a durable receipt on disk, so a rerun is a resume and nothing is paid for
twice.  Import everything from here::

    import playbook as pb
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from playbook.errors import (
    PlaybookError,
    PlayDefinitionError,
    ProviderExhausted,
    ProviderUnavailable,
    ReceiptError,
    RunFatal,
    ToolError,
)
from playbook.frontends import register as _register
from playbook.plays.play import Play, play
from playbook.providers.provider import Provider
from playbook.records import ProviderWait, Receipt, RunStats
from playbook.runtime import Run, last_run
from playbook.runtime.calls.context import Context
from playbook.runtime.estimate.projection import Estimate
from playbook.store import ReceiptStore
from playbook.store.fixtures import Fixtures, fixtures
from playbook.tools import Secret, Tool, http_tool, llm_tool, secret, tool

__version__ = "0.1.0"

__all__ = [
    "ClusterRun",
    "Context",
    "Estimate",
    "Fixtures",
    "Play",
    "PlayDefinitionError",
    "PlaybookError",
    "Provider",
    "ProviderExhausted",
    "ProviderUnavailable",
    "ProviderWait",
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

if _TYPE_CHECKING:
    from playbook import demo
    from playbook.cluster import ClusterRun

_register()  # df.play now; pl.DataFrame.play and ddf.play now or once Polars or Dask is imported


def __dir__() -> list[str]:
    return sorted({*globals(), "ClusterRun", "demo"})


def __getattr__(name: str) -> _Any:
    # Loaded when first used: the demo provider (a web server and its data, pb.demo.serve()) and
    # the cluster's run (what ddf.play.run returns).
    import importlib

    if name == "demo":
        return importlib.import_module(".demo", __name__)
    if name == "ClusterRun":
        return importlib.import_module(".cluster", __name__).ClusterRun
    if name == "ProviderHold":  # a down provider is not a hold: the record is of a provider rows wait on
        from playbook._internal.renamed import renamed

        renamed("pb.ProviderHold", "pb.ProviderWait")
        return ProviderWait
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext playbook``: registers the ``%%play`` cell magic."""
    from playbook.frontends.magic import (
        PlayMagics,  # IPython is imported only here: the runtime stays Jupyter-free
    )

    ipython.register_magics(PlayMagics)  # type: ignore[attr-defined]
