"""A play over a Dask DataFrame on a dask.distributed cluster: the job (:mod:`.job`), what each
worker runs (:mod:`.worker`) and what they tell each other (:mod:`.wire`, :mod:`.state`).  The
``ddf.play`` accessor is :mod:`playbook.frontends.dask`."""

from playbook.cluster.job import ClusterRun

__all__ = ["ClusterRun"]
