"""The demo provider served in process (``pb.demo.serve(in_process=True)``): a run reaches it
through the transport mounted at its origin, without a socket, and on the loop's clock its
limits pass in virtual time."""

from __future__ import annotations

import asyncio
import re

import httpx
import pandas as pd
import pytest
from vtime import LoopClock, run_virtual

import playbook as pb
from playbook.tools import transport


def _people(n: int) -> pd.DataFrame:
    return pd.DataFrame({"domain": [f"company{i}.com" for i in range(n)], "first": ["Ann"] * n})


def test_a_run_reaches_a_demo_served_in_process(store: pb.ReceiptStore) -> None:
    """A run's calls to http://demo.local reach the demo served in this process: a name no
    network resolves, so nothing went through a socket."""
    with pb.demo.serve(in_process=True, miss_rate=0.0) as demo:
        # demo.local, or demo-2.local... while the session's demo is served too
        assert re.fullmatch(r"http://demo(-\d+)?\.local", demo.url) and demo.port is None and demo.running
        out = _people(5).play.map(pb.demo.email_tool(demo), store=store, progress=False)
        assert out["play_status"].tolist() == ["ok"] * 5 and out["demo.email"].str.endswith(".com").all()
        assert demo.stats()["requests"] == 5
    assert not demo.running and "stopped" in repr(demo)


def test_demos_in_process_have_origins_of_their_own_until_they_stop(store: pb.ReceiptStore) -> None:
    """Two demos served in process at once answer at two origins, each counting its own calls;
    a stopped one is unmounted and its origin goes to the next one served."""
    first = pb.demo.serve(in_process=True)
    second = pb.demo.serve(in_process=True)
    try:
        assert first.url != second.url
        _people(3).play.map(pb.demo.email_tool(second), store=store, progress=False)
        assert (first.stats()["requests"], second.stats()["requests"]) == (0, 3)
        freed = first.url
        first.stop()
        first.stop()  # twice is harmless
        third = pb.demo.serve(in_process=True)
        assert third.url == freed
        third.stop()
    finally:
        first.stop()
        second.stop()


def test_a_read_timeout_ends_a_call_to_a_demo_in_process(store: pb.ReceiptStore) -> None:
    """A provider in process slower than the call's timeout fails the call with a timeout, as a
    server on a socket would: the app answering in the caller's loop does not block it."""
    with pb.demo.serve(in_process=True, clock=LoopClock(), latency=30.0) as demo:
        tool = pb.demo.email_tool(demo, timeout=0.5)

        async def main() -> tuple[pd.DataFrame, float]:
            out = await _people(1).play.amap(tool, store=store, progress=False)
            return out, asyncio.get_running_loop().time()

        out, took = run_virtual(main())
    assert out["play_status"].tolist() == ["failed"]
    assert "timed out after 0.5s" in out.loc[0, "play_error"]
    assert took < 30  # no try waited for the answer


def test_an_hour_long_quota_is_waited_out_in_virtual_time(store: pb.ReceiptStore) -> None:
    """On the loop's clock, a demo in process holds for an hour (429, Retry-After 3600) and the
    run waits it out in virtual time: every row answered, the quota's second hour billed."""
    with pb.demo.serve(in_process=True, clock=LoopClock(), quota=3, quota_reset=3600, miss_rate=0.0) as demo:
        tool = pb.demo.email_tool(demo, provider=pb.Provider("quota", max_wait=7200, concurrency=1))

        async def main() -> tuple[pd.DataFrame, float]:
            out = await _people(5).play.amap(tool, store=store, progress=False)
            return out, asyncio.get_running_loop().time()

        out, took = run_virtual(main())
        stats = demo.stats()
    assert out["play_status"].tolist() == ["ok"] * 5
    assert 3600 <= took < 2 * 3600
    assert stats["by_status"]["200"] == 5 and stats["quota_exceeded"] >= 1


def test_what_a_demo_in_process_cannot_do_is_refused_plainly() -> None:
    """A port with in_process=True is a ValueError naming it; restart() has no port to close."""
    with pytest.raises(ValueError, match=r"serve\(in_process=True\) opens no port: leave out port=0"):
        pb.demo.serve(port=0, in_process=True)
    with pb.demo.serve(in_process=True) as demo, pytest.raises(RuntimeError, match="no port to close"):
        demo.restart(1)


def test_mount_takes_an_origin_once() -> None:
    """mount() takes a scheme and a host, once each; unmount() sends calls to the network again."""
    app_transport = httpx.MockTransport(lambda request: httpx.Response(204))
    with pytest.raises(ValueError, match="an origin such as 'http://demo.local', not 'demo.local'"):
        transport.mount("demo.local", app_transport)
    with pytest.raises(ValueError, match="not 'http://x.local/v1'"):
        transport.mount("http://x.local/v1", app_transport)
    transport.mount("http://x.local", app_transport)
    try:
        with pytest.raises(ValueError, match="http://x.local is mounted already"):
            transport.mount("http://x.local", app_transport)

        async def ask() -> int:
            async with transport.default_client() as client:
                return (await client.get("http://x.local/anything")).status_code

        assert asyncio.run(ask()) == 204
    finally:
        transport.unmount("http://x.local")
    transport.mount("http://x.local", app_transport)  # free again
    transport.unmount("http://x.local")
