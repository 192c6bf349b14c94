"""``pl.DataFrame.play``: ``map``, ``run``, ``amap`` and ``arun`` on a Polars frame, returning Polars.

The run itself is the pandas one (:class:`~playbook.frontends.pandas.PlayAccessor`); this module only
converts on the way in and on the way out:

- **In.**  Each column goes over as the Python values Polars gives (``df.rows()``): a play sees an
  int or ``None`` in an int column with nulls (not a float), a ``datetime`` with its zone, a
  ``date``, a ``Decimal``, a list, a dict for a struct, a str for a categorical.  These are the
  values an equal pandas frame gives a play too, so a row has the same identity either way, and a
  user who switches library reuses the receipts and row memos already paid for.
- **Out.**  Input columns the play did not replace are the original Polars columns, dtypes and
  all.  Every other column is typed when Polars gives back exactly the values the run returned;
  otherwise (mixed types, dicts with different keys, objects Polars has no type for) it is an
  ``Object`` column holding them as they are.  Converting never fails: the calls are paid for.

``import playbook`` does not import Polars (about 0.2 s, a fifth more, for every user): the
namespace is registered at once if Polars is imported already, else when it is
(:func:`playbook.frontends.register`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Unpack

import pandas as pd

from playbook._internal.renamed import old_attribute, renamed
from playbook.errors import PlayDefinitionError
from playbook.frontends.pandas import PlayAccessor
from playbook.frontends.polars_convert import frames, to_polars, whole_frame
from playbook.frontends.signature import run_signature
from playbook.records import ProviderWait, RunStats
from playbook.runtime import Run, RunState
from playbook.runtime.estimate.projection import Estimate

if TYPE_CHECKING:
    import polars as pl

    from playbook.frontends._kwargs import MapKwargs, RunKwargs
    from playbook.plays.play import PlayLike

__all__ = ["PolarsPlay", "PolarsRun"]


class PolarsPlay:
    """``df.play.map(play)`` → Polars DataFrame; ``df.play.run(play)`` → :class:`PolarsRun`."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self._frame = frame

    @run_signature("map")
    def map(self, play: PlayLike, **options: Unpack[MapKwargs]) -> pl.DataFrame:
        """Run ``play`` over every row and return the result as a Polars DataFrame (blocking).

        ``play``: a ``@pb.play``, an ``async def (row, ctx)``, or a tool (inputs bound from
        same-named columns).
        """
        rows, sent = frames(self._frame, options.get("limit"))
        return to_polars(PlayAccessor(sent).map(play, **options), rows, sent)

    @run_signature("map")
    def estimate(
        self,
        play: PlayLike,
        sample: int = 20,
        *,
        seed: int | None = 0,
        first: bool = False,
        precision: float | None = None,
        **options: Unpack[MapKwargs],
    ) -> Estimate:
        """A pilot of ``play`` on ``sample`` of the rows a run would run, projected over the rest
        (see ``pandas.DataFrame.play.estimate``)."""
        _, sent = frames(self._frame, options.get("limit"))
        return PlayAccessor(sent).estimate(
            play, sample, seed=seed, first=first, precision=precision, **options
        )

    @run_signature("run")
    def run(self, play: PlayLike, **options: Unpack[RunKwargs]) -> PolarsRun:
        """Run ``play`` and return the :class:`PolarsRun`; with ``background=True``, return at once
        (the run goes on in the kernel's loop)."""
        rows, sent = frames(self._frame, options.get("limit"))
        return PolarsRun(PlayAccessor(sent).run(play, **options), rows, sent)

    @run_signature("map")
    async def amap(self, play: PlayLike, **options: Unpack[MapKwargs]) -> pl.DataFrame:
        """Async form of :meth:`map`."""
        rows, sent = frames(self._frame, options.get("limit"))
        return to_polars(await PlayAccessor(sent).amap(play, **options), rows, sent)

    @run_signature("run")
    async def arun(self, play: PlayLike, **options: Unpack[RunKwargs]) -> PolarsRun:
        """Async form of :meth:`run`."""
        rows, sent = frames(self._frame, options.get("limit"))
        return PolarsRun(await PlayAccessor(sent).arun(play, **options), rows, sent)


class _LazyPlay:
    """``lazy_frame.play``: a LazyFrame has no rows until it is collected, so say so."""

    def __init__(self, frame: pl.LazyFrame) -> None:
        self._frame = frame

    def __getattr__(self, name: str) -> Any:
        if name not in ("map", "run", "amap", "arun"):
            raise AttributeError(name)  # hasattr() and IPython's probing must see a plain "no"
        raise PlayDefinitionError(
            f"play.{name}() runs over rows, and a LazyFrame has none until it is collected: "
            f"call .collect() first, e.g. lf.collect().play.{name}(...)"
        )


class PolarsRun:
    """A :class:`playbook.Run` over a Polars frame: ``.result``, ``.wait()``, ``.errors``,
    ``.parked`` and ``.waterfalls`` are Polars frames; the rest is the run's own.

    ``.pandas`` is the underlying :class:`playbook.Run` (with pandas frames); it is also what
    ``pb.last_run()`` returns.
    """

    __slots__ = ("_converted", "_rows", "_sent", "pandas")

    def __init__(self, run: Run, rows: pl.DataFrame, sent: pd.DataFrame) -> None:
        self.pandas = run
        self._rows = rows  # the Polars rows that ran (after limit)
        self._sent = sent  # and the pandas frame they ran as
        self._converted: tuple[pd.DataFrame, pl.DataFrame] | None = None

    def __repr__(self) -> str:
        return "<Polars" + repr(self.pandas).removeprefix("<")

    def _repr_html_(self) -> str:
        return self.pandas._repr_html_()

    @property
    def result(self) -> pl.DataFrame:
        """The result so far: input rows, output columns, ``play_status``, ``play_error``."""
        frame = self.pandas.result
        # A finished run hands back the same pandas frame each time: convert it once.
        if self._converted is None or self._converted[0] is not frame:
            self._converted = (frame, to_polars(frame, self._rows, self._sent))
        return self._converted[1]

    def wait(self) -> pl.DataFrame:
        """Block until a background run finishes; returns the result."""
        self.pandas.wait()
        return self.result

    def stop(self) -> None:
        """Stop starting rows (see :meth:`playbook.Run.stop`)."""
        self.pandas.stop()

    def events(self) -> list[dict[str, Any]]:
        """What happened in this run, as kept with ``events=`` (see :meth:`playbook.Run.events`)."""
        return self.pandas.events()

    def retry(self, *, statuses: tuple[str, ...] = ("failed", "parked")) -> PolarsRun:
        """Run the failed and parked rows again: the retry's own run (see :meth:`playbook.Run.retry`)."""
        again = self.pandas.retry(statuses=statuses)
        return self if again is self.pandas else PolarsRun(again, self._rows, self._sent)

    @property
    def previous(self) -> PolarsRun | None:
        """The run this one retried (``None`` for a first run)."""
        before = self.pandas.previous
        return None if before is None else PolarsRun(before, self._rows, self._sent)

    @property
    def run_id(self) -> str:
        return self.pandas.run_id

    @property
    def running(self) -> bool:
        return self.pandas.running

    @property
    def state(self) -> RunState:
        return self.pandas.state

    @property
    def stats(self) -> RunStats:
        return self.pandas.stats

    @property
    def waiting_on(self) -> list[ProviderWait]:
        return self.pandas.waiting_on

    def __getattr__(self, name: str) -> Any:
        return old_attribute(self, name, _OLD)

    @property
    def notices(self) -> list[str]:
        return self.pandas.notices

    @property
    def view(self) -> Any:
        return self.pandas.view

    @property
    def errors(self) -> pl.DataFrame:
        """Failed rows: position (``row`` and ``position`` alike), error message."""
        return whole_frame(self.pandas.errors)

    @property
    def parked(self) -> pl.DataFrame:
        """Parked rows: position, why, the provider, when it expects to take calls again, the message."""
        return whole_frame(self.pandas.parked)

    @property
    def waterfalls(self) -> pl.DataFrame:
        """Per waterfall leg: hits, misses, unavailable, errors and how often it was never reached."""
        return whole_frame(self.pandas.waterfalls)


def register() -> None:
    """``pl.DataFrame.play`` and ``pl.LazyFrame.play`` (see :func:`playbook.frontends.register`)."""
    import polars as pl

    pl.api.register_dataframe_namespace("play")(PolarsPlay)
    pl.api.register_lazyframe_namespace("play")(_LazyPlay)


def _holds(run: PolarsRun) -> list[ProviderWait]:
    renamed("PolarsRun.holds", "PolarsRun.waiting_on")  # a down provider is not a hold
    return run.pandas.waiting_on


# Deprecated names, served by __getattr__: they work (warning) and dir(run) leaves them out.
_OLD: dict[str, Callable[[Any], Any]] = {"holds": _holds}
