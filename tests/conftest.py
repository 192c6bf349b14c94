"""Shared fixtures: an isolated store per test, the global last run reset, a demo provider."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import playbook as pb
from playbook.demo.redis_server import RedisServer
from playbook.providers.provider import forget_governors
from playbook.runtime import run as run_module


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
def demo_server() -> Iterator[pb.demo.DemoServer]:
    with pb.demo.serve() as server:
        yield server


@pytest.fixture
def demo(demo_server: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The session's demo provider, with counters, limits and settings reset."""
    demo_server.reset()
    return demo_server
