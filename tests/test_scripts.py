"""Outside a notebook: one event loop per thread across blocking maps (async clients made at module
level keep working), a clear error under a loop that cannot be re-entered (uvloop), amap in a real
uvicorn server with a clean stderr, and pb.last_run() per thread and per task."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import uvloop

import playbook as pb


@pytest.fixture
def demo(demo_loopback: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider on loopback: the scripts run in processes of their own, which reach a provider
    only through a socket."""
    return demo_loopback


# Warnings that a loop or a coroutine was left behind: at exit, they are printed, not raised.
LEFT_BEHIND = (
    "ResourceWarning",
    "Exception ignored",
    "never awaited",
    "Task was destroyed",
    "Event loop is closed",
    "Traceback",
)


def _script(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_a_script_keeps_one_loop_per_thread_across_maps(demo: pb.demo.DemoServer, tmp_path: Path) -> None:
    """A module-level httpx.AsyncClient works in every map of a script, as the default client does; a
    thread's maps run on a loop of its own; the loops are closed at exit with nothing left behind."""
    done = _script(
        """
        import atexit
        kept = []  # every loop a tool ran on; registered first, this runs last at exit
        atexit.register(lambda: print(json.dumps({"closed at exit": [loop.is_closed() for loop in kept]})))

        import asyncio, json, sys, threading
        import httpx, pandas as pd, playbook as pb

        url = sys.argv[1]
        client = httpx.AsyncClient()  # binds its connections to the loop of its first request
        loops = {}

        @pb.tool(name="own_client")
        async def own_client(n: int) -> int:
            r = await client.get(url + "/v1/email", params={"domain": f"d{n}.com", "first": "a"},
                                 headers={"Authorization": "Bearer demo-key"})
            return r.status_code

        @pb.tool(name="which_loop")
        async def which_loop(thread: str, start: int) -> int:
            loops.setdefault(thread, set()).add(id(asyncio.get_running_loop()))
            kept.append(asyncio.get_running_loop())
            return 0

        default_client = pb.http_tool("acme.email", method="GET", url=url + "/v1/email",
                                      params={"domain": "{domain}", "first": "a"}, headers={"Authorization": "Bearer demo-key"},
                                      pick="email", miss_status=(404,))

        def maps(tools, start):
            statuses = []
            for tool, frame in ((own_client, pd.DataFrame({"n": [start, start + 1]})), (default_client, pd.DataFrame({"domain": [f"x{start}.com"]})),
                                (which_loop, pd.DataFrame({"thread": [threading.current_thread().name], "start": [start]}))):
                if tool in tools:
                    statuses += frame.play.map(tool, progress=False)["play_status"].tolist()
            return statuses

        main = maps((own_client, default_client, which_loop), 1) + maps((own_client, default_client, which_loop), 3)
        seen = []
        thread = threading.Thread(target=lambda: seen.extend(maps((default_client, which_loop), 5) + maps((default_client, which_loop), 7)))
        thread.start(); thread.join()
        print(json.dumps({"main": main, "thread": seen, "loops": sorted(len(ids) for ids in loops.values()),
                          "shared": bool(set.intersection(*loops.values()))}))
        """,
        demo.url,
        env={"PLAYBOOK_HOME": str(tmp_path / "home")},
    )
    assert done.returncode == 0, done.stderr
    got, at_exit = map(json.loads, done.stdout.splitlines())
    assert at_exit == {"closed at exit": [True] * 4}
    assert got["main"] == ["ok"] * 8 and got["thread"] == ["ok"] * 4
    assert got["loops"] == [1, 1] and got["shared"] is False  # one loop per thread, each its own
    assert not any(sign in done.stderr for sign in LEFT_BEHIND), done.stderr


@pb.tool(name="loop_of")
async def loop_of(n: int) -> int:
    return n


def _loop_of_a_map() -> asyncio.AbstractEventLoop:
    """The loop a blocking map in this thread runs on, as its tool sees it."""
    seen: list[asyncio.AbstractEventLoop] = []

    @pb.tool(name="the_loop")
    async def the_loop(n: int) -> int:
        seen.append(asyncio.get_running_loop())
        return n

    pd.DataFrame({"n": [0]}).play.map(the_loop, store="memory", progress=False)
    return seen[0]


def test_a_threads_loop_lasts_across_maps_and_closes_when_the_thread_goes() -> None:
    """Two maps in one thread run on one loop, another thread's on another; a thread's loop is closed
    once the thread is gone."""
    loops: dict[str, list[asyncio.AbstractEventLoop]] = {}
    with warnings.catch_warnings():  # what earlier tests left for the collector is theirs, not this test's
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()

    def two_maps(name: str) -> None:
        loops[name] = [_loop_of_a_map(), _loop_of_a_map()]

    worker = threading.Thread(target=two_maps, args=("worker",))
    worker.start()
    worker.join()
    two_maps("main")
    assert loops["worker"][0] is loops["worker"][1] and loops["main"][0] is loops["main"][1]
    assert loops["worker"][0] is not loops["main"][0]
    assert not loops["worker"][0].is_closed()  # its Thread object is still held here
    del worker
    gc.collect()
    assert loops["worker"][0].is_closed() and not loops["main"][0].is_closed()


CALLS: list[int] = []


@pb.tool(name="counted")
def counted(n: int) -> int:
    CALLS.append(n)
    if n == 2:
        raise ValueError("two is refused")
    return n


def test_blocking_calls_under_uvloop_name_the_await_form(store: pb.ReceiptStore) -> None:
    """Under a running uvloop loop, map(), run(), Run.wait() and Run.retry() raise PlayDefinitionError
    naming the await form before anything runs, and leave no coroutine un-awaited."""
    CALLS.clear()
    frame = pd.DataFrame({"n": [1, 2]})

    async def main() -> dict[str, Any]:
        said: dict[str, Any] = {}
        for name, call in (("map", frame.play.map), ("run", frame.play.run)):
            with pytest.raises(pb.PlayDefinitionError) as info:
                call(counted, store=store, progress=False)
            said[name] = str(info.value)
        said["calls before"] = list(CALLS)
        background = await frame.play.arun(counted, store=store, progress=False, background=True)
        with pytest.raises(pb.PlayDefinitionError) as info:
            background.wait()
        said["wait"] = str(info.value)
        while background.running:
            await asyncio.sleep(0.01)
        done = await frame.play.arun(counted, store=store, progress=False)
        with pytest.raises(pb.PlayDefinitionError) as info:
            done.retry()
        said["retry"] = str(info.value)
        said["failed after"] = done.stats.failed
        return said

    said = uvloop.run(main())
    assert said["calls before"] == [] and sorted(CALLS) == [1, 2, 2]  # nothing ran until arun
    assert "await df.play.amap(...)" in said["map"] and "await df.play.arun(...)" in said["run"]
    assert all("uvloop.Loop" in said[name] for name in ("map", "run", "wait", "retry"))
    assert "run.wait() cannot block" in said["wait"] and "await df.play.arun(...)" in said["wait"]
    assert "run.retry() cannot block" in said["retry"] and "await df.play.arun(...) again" in said["retry"]
    assert said["failed after"] == 1  # the refused retry requeued nothing


def test_last_run_is_per_thread() -> None:
    """Two threads blocking on run() at the same time each get their own Run from pb.last_run()."""
    barrier = threading.Barrier(2, timeout=30)

    @pb.tool(name="meet")
    def meet(n: int) -> int:
        if n < 0:
            barrier.wait()  # both runs are under way before either ends
        return n

    seen: dict[str, bool] = {}

    def one(name: str, first: int) -> None:
        run = pd.DataFrame({"n": [first, 1, 2]}).play.run(meet, store="memory", progress=False)
        seen[name] = pb.last_run() is run

    threads = [
        threading.Thread(target=one, args=(name, first), daemon=True)
        for name, first in (("a", -1), ("b", -2))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen == {"a": True, "b": True}


def test_threads_on_the_default_store_at_once() -> None:
    """Two threads mapping at the same time on the default store both finish, and their receipts
    land in the one store."""
    barrier = threading.Barrier(2, timeout=30)

    @pb.tool(name="meet_default")
    def meet(n: int) -> int:
        if n < 0:
            barrier.wait()  # both runs are under way before either goes on
        return n

    statuses: dict[str, list[str]] = {}

    def one(name: str, first: int) -> None:
        out = pd.DataFrame({"n": [first, *range(1000 * -first, 1000 * -first + 200)]}).play.map(
            meet, progress=False, concurrency=8
        )
        statuses[name] = sorted(set(out["play_status"]))

    threads = [
        threading.Thread(target=one, args=(name, first), daemon=True)
        for name, first in (("a", -1), ("b", -2))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == {"a": ["ok"], "b": ["ok"]}
    store = pb.ReceiptStore()
    try:
        assert store.stats()["receipts"] == 402
    finally:
        store.close()


@pytest.mark.parametrize("where", ["directory", "memory"])
def test_threads_sharing_one_store_object(where: str, tmp_path: Path) -> None:
    """One pb.ReceiptStore given to maps in several threads at once (a server's worker threads and a
    module-level store): every run finishes, and they share its receipts (a row another run was
    paying for when this one met it comes back reused from that run's memo, or from its receipt)."""
    store = pb.ReceiptStore(tmp_path / "shared" if where == "directory" else "memory")

    paid: list[int] = []

    @pb.tool(name="slow_double", version="1")
    async def double(n: int) -> int:
        paid.append(n)
        await asyncio.sleep(0.001)  # rows of each run overlap in flight
        return n * 2

    statuses: dict[int, list[str]] = {}

    def one(i: int) -> None:
        out = pd.DataFrame({"n": range(i * 100, i * 100 + 300)}).play.map(double, store=store, progress=False)
        statuses[i] = sorted(set(out["play_status"]))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a run sharing the store hung"
    assert sorted(statuses) == [0, 1, 2] and all(
        "ok" in s and set(s) <= {"ok", "reused"} for s in statuses.values()
    ), statuses
    assert store.stats()["receipts"] == 500  # 0..499: the runs overlap by 200 inputs
    assert len(paid) == 500 and len(set(paid)) == 500  # each paid for once


def test_amap_shows_text_only_on_a_terminal(store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """amap() with progress="auto" shows no view when stderr is not a terminal, text when it is or when
    asked; map() keeps its text either way."""
    frame = pd.DataFrame({"n": [1]})

    def views() -> list[str]:
        async def main() -> list[str]:
            auto = await frame.play.arun(loop_of, store=store)
            asked = await frame.play.arun(loop_of, store=store, progress=True)
            return [type(auto.view).__name__, type(asked.view).__name__]

        return [*asyncio.run(main()), type(frame.play.run(loop_of, store=store).view).__name__]

    primary, secondary = os.openpty()  # a terminal, as a shell gives stderr
    try:
        with open(os.devnull, "w") as devnull, open(secondary, "w", closefd=False) as terminal:
            monkeypatch.setattr(sys, "stderr", devnull)
            assert views() == ["NoneType", "TextView", "TextView"]
            monkeypatch.setattr(sys, "stderr", terminal)
            assert views() == ["TextView", "TextView", "TextView"]
    finally:
        os.close(secondary)
        os.close(primary)


# -- a real server ---------------------------------------------------------------------------

APP = """
import asyncio, os, socket, sys
import pandas as pd, playbook as pb, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

both = asyncio.Event()
arrived = []

@pb.tool(name="wait_for_both")
async def wait_for_both(n: int) -> int:
    arrived.append(n)
    if len(arrived) == 2:
        both.set()
    await asyncio.wait_for(both.wait(), 30)  # the two requests' runs are under way at once
    return n * 10

async def enrich(request):
    n = int(request.query_params["n"])
    run = await pd.DataFrame({"n": [n]}).play.arun(wait_for_both)
    return JSONResponse({"out": run.result["wait_for_both"].tolist(), "mine": pb.last_run() is run})

async def blocking(request):
    try:
        pd.DataFrame({"n": [1]}).play.map(wait_for_both)
    except pb.PlayDefinitionError as exc:
        return JSONResponse({"error": str(exc)}, status_code=500)
    return JSONResponse({"error": None})

app = Starlette(routes=[Route("/enrich", enrich), Route("/blocking", blocking)])
listener = socket.socket(fileno=int(sys.argv[1]))
uvicorn.Server(uvicorn.Config(app, loop="uvloop", log_level="warning", access_log=False)).run(sockets=[listener])
"""


@pytest.mark.slow
def test_amap_in_a_uvicorn_server(tmp_path: Path) -> None:
    """In a uvicorn app on uvloop, an endpoint awaiting amap works, each request's pb.last_run() is its
    own, nothing is written to the server's stderr, and a blocking map() says to await amap."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-W", "always::ResourceWarning", "-c", APP, str(listener.fileno())],
        pass_fds=[listener.fileno()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PLAYBOOK_HOME": str(tmp_path / "home")},
    )
    listener.close()
    try:

        async def requests() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                return list(
                    await asyncio.gather(
                        client.get("/enrich?n=1"), client.get("/enrich?n=2"), client.get("/blocking")
                    )
                )

        first, second, blocking = asyncio.run(requests())
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert first.json() == {"out": [10], "mine": True} and second.json() == {"out": [20], "mine": True}
    assert blocking.status_code == 500 and "use await df.play.amap(...)" in blocking.json()["error"]
    assert stderr == ""
