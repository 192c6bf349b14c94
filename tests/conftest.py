"""Shared fixtures: an isolated store per test, the global last run reset, a demo provider, Redis,
and the engines of the promise suite."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from demo_process import DemoProcess
from engines import THREADS, WORKERS, Cluster, Engine, OneProcess, Processes, RedisCluster, engines_of
from hypothesis import settings
from vtime import LoopClock

import playbook as pb
from playbook.demo.redis_server import RedisClusterServer, RedisServer
from playbook.providers.provider import forget_governors
from playbook.runtime import run as run_module

# The property tests check what a value becomes, not how fast: a loaded machine that stalls one
# example past Hypothesis's 200 ms deadline says nothing about the code.
settings.register_profile("playbook", deadline=None)
settings.load_profile("playbook")


@pytest.fixture(scope="session", autouse=True)
def _marks_of_this_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Kernels, servers and workers that module fixtures start keep their marks of stores in this
    session's directory, not the user's: pytest's numbered directories come round again, and a
    store made anew at an earlier session's path is not one that lost its receipts."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PLAYBOOK_MARKS", str(tmp_path_factory.mktemp("session-marks")))
        yield


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test gets its own default store directory, its own marks of stores and no remembered last run."""
    monkeypatch.setenv("PLAYBOOK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PLAYBOOK_MARKS", str(tmp_path / "marks"))
    monkeypatch.delenv("DEMO_API_KEY", raising=False)
    monkeypatch.delenv("PLAYBOOK_FIXTURES", raising=False)
    run_module._last = None
    forget_governors()  # equal Providers share a governor in a process: not across tests
    yield
    run_module._last = None


@pytest.fixture
def store(tmp_path: Path) -> Iterator[pb.ReceiptStore]:
    s = pb.ReceiptStore(tmp_path / "store")
    yield s
    s.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A real Redis server's URL, emptied for this test."""
    redis_server.flush()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServer]:
    """A Redis Cluster of 3 masters, each with a replica, for the tests that share it (one that
    kills a node starts a cluster of its own)."""
    with RedisClusterServer() as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterServer) -> str:
    """A plain ``redis://`` URL of one node of a real Redis Cluster, emptied for this test."""
    redis_cluster.flush()
    return redis_cluster.url


@pytest.fixture(params=["server", "cluster"])
def any_redis_url(request: pytest.FixtureRequest) -> str:
    """One Redis server, then a Redis Cluster: what a store or shared limits promise on one they
    promise on the other."""
    return str(request.getfixturevalue("redis_url" if request.param == "server" else "cluster_url"))


@pytest.fixture(scope="session")
def demo_in_process() -> Iterator[pb.demo.DemoServer]:
    with pb.demo.serve(in_process=True, clock=LoopClock()) as server:
        yield server


@pytest.fixture(scope="session")
def demo_server() -> Iterator[pb.demo.DemoServer]:
    with pb.demo.serve() as server:
        yield server


@pytest.fixture(scope="session")
def demo_elsewhere() -> Iterator[DemoProcess]:
    process = DemoProcess()
    yield process
    process.stop()


@pytest.fixture
def demo(request: pytest.FixtureRequest, demo_in_process: pb.demo.DemoServer) -> Any:
    """The session's demo provider served in this process (no socket: ``serve(in_process=True)``),
    with counters, limits and settings reset.  It answers in the run's own event loop, on that
    loop's clock: virtual time under ``run_virtual``, real time under ``map()``.  A request is
    judged as it is sent, with no socket to queue in, so a strict provider's verdicts do not
    depend on how busy the test's process is.

    A promise run on an engine of several processes (``engine``) is held against one in a
    process of its own, which they can all reach (see tests/demo_process.py)."""
    if "engine" in request.fixturenames and request.getfixturevalue("engine").name != "one process":
        elsewhere: DemoProcess = request.getfixturevalue("demo_elsewhere")
        elsewhere.reset()
        return elsewhere
    demo_in_process.reset()
    return demo_in_process


@pytest.fixture
def demo_loopback(demo_server: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The session's demo provider on a real loopback socket, reset: for what only a socket
    shows (a subprocess or another client calling it, a port that closes)."""
    demo_server.reset()
    return demo_server


# -- the promise suite (test_promises_*): each engine in turn ----------------------------------------


@pytest.fixture(scope="module")
def dask_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A cluster of two worker processes, for the tests of one file (a client left open would be
    every later test's default client)."""
    from distributed import Client, LocalCluster

    # The workers' own marks of stores are theirs, as on other machines: not the client's.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PLAYBOOK_MARKS", str(tmp_path_factory.mktemp("worker-marks")))
        cluster = LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=THREADS,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        )
    with cluster, Client(cluster) as client:
        yield client


@pytest.hookimpl(tryfirst=True)  # the engine first in a test's id, before its own parameters
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine" in metafunc.fixturenames:  # a promise: each engine its file runs on, in turn
        metafunc.parametrize("engine", engines_of(metafunc.module.__name__), indirect=True)


@pytest.fixture
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Engine:
    """Each engine in turn (``engines_of`` the test's file): the promise is the same on every one."""
    if request.param == "one process":
        return OneProcess(tmp_path / "store", tmp_path)
    redis_url = request.getfixturevalue("cluster_url" if request.param == "redis cluster" else "redis_url")
    # Emptied for this test on purpose, and said so (as a user who flushes a store accepts the loss): a
    # cluster's workers outlive a test, with the store they had open, and would take the empty
    # store for one that lost the last test's receipts.
    emptied = pb.ReceiptStore(redis_url)
    emptied.accept_loss()
    emptied.close()
    if request.param == "processes":
        return Processes(redis_url, tmp_path)
    if request.param == "redis cluster":
        return RedisCluster(redis_url, tmp_path)
    return Cluster(request.getfixturevalue("dask_client"), redis_url)


@pytest.fixture
def name() -> Callable[[str], str]:
    """A provider's name for this test alone."""
    token = uuid.uuid4().hex[:6]
    return lambda base: f"{base}-{token}"
