"""The run options as ``TypedDict``s, for type checkers (``**options: Unpack[MapKwargs]``).

Generated from :class:`playbook.runtime.options.RunOptions` by
``make generate``: edit the declaration there, not this file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypedDict

from playbook.store import ReceiptStore
from playbook.store.fixtures import Fixtures

__all__ = ["MapKwargs", "RunKwargs"]


class MapKwargs(TypedDict, total=False):
    """The options of ``map()`` and ``amap()``."""

    concurrency: int | None
    on_error: Literal["isolate", "raise"]
    refresh: bool | Literal["rows", "all"]
    max_cost: float | None
    limit: int | None
    id_columns: str | Sequence[str] | None
    progress: Literal["auto", "widget", "text", "none"] | bool
    store: ReceiptStore | str | os.PathLike[str] | None
    max_wait: float | None
    overwrite: bool
    fixtures: Fixtures | str | os.PathLike[str] | None
    estimate: bool
    events: str | os.PathLike[str] | bool | Callable[[dict[str, Any]], Any] | None


class RunKwargs(MapKwargs, total=False):
    """The options of ``run()`` and ``arun()``: ``map()``'s and ``background``."""

    background: bool
