"""A play over a Dask DataFrame on a dask.distributed cluster (``ddf.play``); see :mod:`.frames`."""

from .frames import DaskPlay
from .job import ClusterRun

__all__ = ["ClusterRun", "DaskPlay"]
