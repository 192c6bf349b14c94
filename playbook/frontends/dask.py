"""``ddf.play``: a play over a Dask DataFrame, one partition per task on a dask.distributed cluster.

``import playbook`` does not import Dask: the accessor is registered when ``dask.dataframe`` is
imported, before or after playbook (:func:`playbook.frontends.register`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack
from urllib.parse import urlsplit

from playbook._internal.dist import install_hint
from playbook.cluster.job import ClusterRun
from playbook.errors import PlayDefinitionError, ReceiptError
from playbook.frontends.asking import go_on
from playbook.frontends.pandas import PlayAccessor, check_columns, refuse_background
from playbook.frontends.signature import run_signature
from playbook.plays.play import as_play
from playbook.runtime.estimate.projection import PILOT_ROWS, Estimate
from playbook.runtime.options import RunOptions
from playbook.runtime.options import options as run_options
from playbook.runtime.run import remember
from playbook.store import ReceiptStore, engine
from playbook.store.location import home, is_url
from playbook.ui import Controls, attach_view

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client

    from playbook.frontends._kwargs import MapKwargs, RunKwargs
    from playbook.plays.play import PlayLike

__all__ = ["DaskPlay"]

_SCHEMES = ("redis", "rediss", "unix")
# What only the client acts on: it takes the first `limit` rows, shows the panel, returns at once
# or not, reaches the store's Redis and refuses fixtures.  Each partition's run is given every
# other option, so an option added to RunOptions reaches the workers unless it is named here.
_CLIENT_OPTIONS = frozenset({"limit", "progress", "background", "store", "fixtures", "estimate", "events"})


class DaskPlay:
    """``ddf.play.map(play, store="redis://...")`` → a Dask DataFrame; ``ddf.play.run(...)`` → a
    :class:`ClusterRun`.  Each partition runs on a worker of the current ``dask.distributed``
    client with the local engine; receipts, memos, leases and provider limits live in Redis."""

    def __init__(self, frame: dd.DataFrame) -> None:
        self._frame = frame

    @run_signature("map")
    def map(self, play: PlayLike, **options: Unpack[MapKwargs]) -> dd.DataFrame:
        """Run ``play`` over every row on the cluster and return the result as a Dask DataFrame
        (blocking; its partitions stay on the workers, ``.compute()`` brings it here).

        ``concurrency`` is rows in flight per partition.  ``store`` must be a Redis every worker
        reaches (``"redis://host:6379/0"``, a ``pb.ReceiptStore`` over one, or ``$PLAYBOOK_HOME``
        naming one).  Every provider's rate, calls in flight and holds are shared there across
        the cluster.  ``fixtures`` are refused: a cluster's calls are made on its workers.
        """
        refuse_background(
            options,
            "map() returns the finished Dask DataFrame; for a background run use ddf.play.run(play, background=True)",
        )
        return self.run(play, **options).result

    @run_signature("run")
    def run(self, play: PlayLike, **options: Unpack[RunKwargs]) -> ClusterRun:
        """Run ``play`` on the cluster and return the :class:`ClusterRun`; with
        ``background=True``, return at once (the job goes on; the panel's Stop stops it)."""
        opts = RunOptions.parse(options)
        if opts.estimate:
            return self._asked(play, options, opts)
        if opts.replaying is not None:
            # fixtures=, a `with pb.fixtures(...)` around it, or $PLAYBOOK_FIXTURES
            raise PlayDefinitionError(
                "fixtures answer calls from a file in this process, and a cluster run makes its calls on the workers: "
                "record or replay on a pandas frame instead (ddf.compute().play.map(...))"
            )
        the_play = as_play(play)
        check_columns(self._frame, play, opts)
        url = _redis_url(opts.store)
        client = _client()
        # reachable, a store, and not one that lost its receipts: said now, before anything is sent
        opened = ReceiptStore(url)
        opened.close()
        if opened.lost is not None:
            raise ReceiptError(opened.lost)
        worker_options = {
            f.name: getattr(opts, f.name) for f in run_options() if f.name not in _CLIENT_OPTIONS
        }
        job = ClusterRun(self._frame, the_play, opts, client, url, worker_options)
        controls = (
            Controls(stop=job.stop, retry=lambda status: job.retry(statuses=(status,)))
            if opts.background
            else None
        )
        job.view = attach_view(job.state, opts.progress, background=opts.background, controls=controls)
        # pb.last_run(), as a pandas run is: a job that stops (401, Ctrl-C) is still there to read
        remember(job)
        return job.start(background=opts.background)

    def _asked(self, play: PlayLike, options: Mapping[str, Any], opts: RunOptions) -> ClusterRun:
        """``estimate=True``: the pilot (in this process), its estimate shown, the question; the job
        runs the rest on a yes."""
        given: dict[str, Any] = {
            name: value for name, value in options.items() if name not in ("estimate", "background")
        }
        found = self.estimate(play, PILOT_ROWS, **given)
        rest = go_on(found, given)
        if rest is None:
            raise PlayDefinitionError(
                f"not run: the estimate was not accepted ({found.sample} rows of the pilot are done and saved)"
            )
        if not found.rows_left:
            # every row is done: the pilot's summary said so; the job only gathers the rows
            rest["progress"] = False
        return self.run(play, **rest, background=opts.background)

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
        """A pilot of ``play`` on ``sample`` of the rows a job would run, projected over the rest
        (see ``pandas.DataFrame.play.estimate``).  The rows are brought to this process
        (``.compute()``) and the pilot runs here, on the job's store in Redis: the job reuses what
        it paid for.  The projection assumes ``concurrency`` rows in flight on each of the
        partitions the cluster runs at once."""
        opts = RunOptions.parse(options)
        url = _redis_url(opts.store)
        frame = (
            self._frame.head(opts.limit, npartitions=-1) if opts.limit is not None else self._frame.compute()
        )
        at_once = min(
            self._frame.npartitions,
            sum(w.get("nthreads", 1) for w in _client().scheduler_info()["workers"].values()) or 1,
        )
        given = {**options, "store": url, "limit": None, "concurrency": opts.rows_at_once() * at_once}
        return PlayAccessor(frame).estimate(
            play, sample, seed=seed, first=first, precision=precision, **given
        )


def _client() -> Client:
    """The dask.distributed client partitions run on: the current one."""
    try:
        from distributed import default_client
    except ImportError:
        raise PlayDefinitionError(
            f"a Dask DataFrame runs on a dask.distributed cluster, which is not installed: {install_hint('dask')}"
        ) from None
    try:
        return default_client()
    except ValueError:
        raise PlayDefinitionError(
            "no Dask client: connect one first, e.g. `from dask.distributed import Client; client = Client()` (a cluster "
            "on this machine) or `Client('tcp://scheduler-host:8786')`; its workers run the partitions"
        ) from None


def _redis_url(store: Any) -> str:
    """The Redis every worker opens: ``store``, else ``$PLAYBOOK_HOME`` when it names one."""
    if isinstance(store, ReceiptStore):
        where: Any = engine(store).address
    elif store is None:
        where = home()
    else:
        where = os.fspath(store)
    if isinstance(where, str) and is_url(where) and urlsplit(where).scheme in _SCHEMES:
        return where
    shown = store.location if isinstance(store, ReceiptStore) else where
    named = (
        f"store={os.fspath(shown)!r}"
        if store is not None
        else f"no store= given, and the default store is {os.fspath(shown)!r}"
    )
    raise PlayDefinitionError(
        f"{named}: a cluster run keeps its receipts, memos and provider limits in Redis, where every "
        "worker reaches them; pass store='redis://host:6379/0' (or set $PLAYBOOK_HOME to it). A directory is on "
        "one machine, and its SQLite file is not for many processes at once"
    )


def register() -> None:
    """``ddf.play`` (see :func:`playbook.frontends.register`)."""
    from dask.dataframe.extensions import register_dataframe_accessor

    register_dataframe_accessor("play")(DaskPlay)
