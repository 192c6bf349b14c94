"""The run's default HTTP client: it honours the environment as plain httpx does (proxies,
certificates), bounds its connections per host, and says when ``concurrency`` outruns the
process's open-file limit.  Real servers on loopback: the demo, a forward proxy and an HTTPS
server written here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import httpx
import pandas as pd
import pytest
from httpx_aiohttp import HttpxAiohttpClient

import playbook as pb
from playbook.tools.transport import PER_HOST, connection_budget, default_client

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def demo(demo_loopback: pb.demo.DemoServer) -> pb.demo.DemoServer:
    """The demo provider on loopback: what these tests hold is the network transport (proxies,
    connections per host), which a provider served in process would bypass."""
    return demo_loopback


@pytest.fixture(autouse=True)
def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an environment that names no proxy, in either spelling."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


class ForwardProxy:
    """A forward HTTP proxy on loopback: takes absolute-form requests (``GET http://host:port/path``),
    sends them on to the host, relays the answer, and remembers what it forwarded."""

    def __init__(self) -> None:
        self.forwarded: list[str] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")[:-2]
            method, target, version = request_line.split(" ")
            lines = [
                line
                for line in lines
                if not line.lower().startswith(("connection:", "proxy-connection:", "keep-alive:"))
            ]
            length = next(
                (int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")),
                0,
            )
            body = await reader.readexactly(length)
            self.forwarded.append(f"{method} {target}")
            url = urlsplit(target)
            path = url.path + (f"?{url.query}" if url.query else "")
            upstream_reader, upstream_writer = await asyncio.open_connection(url.hostname, url.port or 80)
            sent = (
                "".join(line + "\r\n" for line in [f"{method} {path} {version}", *lines, "Connection: close"])
                + "\r\n"
            )
            upstream_writer.write(sent.encode("latin-1") + body)
            answer = await upstream_reader.read()  # the whole answer: the server closes after it
            upstream_writer.close()
            await upstream_writer.wait_closed()
            answer_head, _, answer_body = answer.partition(b"\r\n\r\n")
            kept = [
                line for line in answer_head.split(b"\r\n") if not line.lower().startswith(b"connection:")
            ]
            writer.write(b"\r\n".join(kept) + b"\r\nConnection: close\r\n\r\n" + answer_body)
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _company_tool(url: str, **options: Any) -> pb.Tool:
    return pb.http_tool(
        "demo.company",
        method="GET",
        url=url + "/v1/company",
        params={"domain": "{domain}"},
        headers={"Authorization": "Bearer demo-key"},
        **options,
    )


DOMAINS = pd.DataFrame({"domain": [f"company{i}.com" for i in range(5)]})


def _through_proxy(
    demo: Any, store: pb.ReceiptStore, monkeypatch: pytest.MonkeyPatch, **env: str
) -> tuple[pd.DataFrame, list[str]]:
    """Map the demo's company endpoint over five domains with a proxy running and ``env`` set
    (``{proxy}`` in a value is the proxy's URL); returns the result and what the proxy forwarded."""

    async def main() -> tuple[pd.DataFrame, list[str]]:
        async with ForwardProxy() as proxy:
            for name, value in env.items():
                monkeypatch.setenv(name, value.format(proxy=proxy.url))
            out = await DOMAINS.play.amap(_company_tool(demo.url), store=store, progress=False)
            return out, proxy.forwarded

    return asyncio.run(main())


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_proxy_in_the_environment_carries_the_calls(variable: str, demo, store, monkeypatch) -> None:
    """With HTTP_PROXY (or http_proxy, or ALL_PROXY) set, every call of a run goes through that proxy."""
    out, forwarded = _through_proxy(demo, store, monkeypatch, **{variable: "{proxy}"})
    assert (
        out["play_status"].tolist() == ["ok"] * 5 and out["demo.company"].iloc[0]["domain"] == "company0.com"
    )
    assert sorted(forwarded) == sorted(f"GET {demo.url}/v1/company?domain=company{i}.com" for i in range(5))
    assert demo.stats()["by_status"] == {"200": 5}


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1", "*"])
def test_no_proxy_covering_the_host_goes_direct(no_proxy: str, demo, store, monkeypatch) -> None:
    """NO_PROXY naming the host (or '*') sends the calls straight to it, past the proxy."""
    out, forwarded = _through_proxy(demo, store, monkeypatch, HTTP_PROXY="{proxy}", NO_PROXY=no_proxy)
    assert out["play_status"].tolist() == ["ok"] * 5
    assert forwarded == [] and demo.stats()["by_status"] == {"200": 5}


# aiohttp (under httpx-aiohttp) warns that its BasicAuth and proxy_auth, which carry a proxy's credentials, are
# deprecated: its own matter, and pytest makes every warning an error.
@pytest.mark.filterwarnings("ignore:BasicAuth is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .proxy_auth. parameter is deprecated:DeprecationWarning")
def test_a_dead_proxy_is_named_in_the_error(demo, store, monkeypatch) -> None:
    """A proxy from the environment that does not answer: the rows say they could not connect
    *through that proxy* (host and port, never its password) and which variable named it."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    out = DOMAINS.play.map(_company_tool(demo.url), store=store, progress=False)
    assert set(out["play_status"]) <= {"failed", "parked"}
    errors = " ".join(out["play_error"])
    assert f"through the proxy http://127.0.0.1:{port} (from $HTTP_PROXY)" in errors, errors
    assert demo.stats()["requests"] == 0
    monkeypatch.setenv("HTTP_PROXY", f"http://user:hunter2@127.0.0.1:{port}")
    out = DOMAINS.play.map(_company_tool(demo.url), store=store, progress=False)
    errors = " ".join(out["play_error"])
    assert f"through the proxy http://127.0.0.1:{port} (from $HTTP_PROXY)" in errors, errors
    assert "hunter2" not in errors and "user:" not in errors


def test_a_socks_proxy_is_left_to_httpx(monkeypatch) -> None:
    """ALL_PROXY=socks5://... gets httpx's own client, which reaches socks proxies (or says which package it needs)."""
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:9")
    try:
        expected: type | str = type(httpx.AsyncClient())
    except ImportError as exc:  # httpx without its socks extra
        expected = str(exc)
    try:
        got: type | str = type(default_client())
    except ImportError as exc:
        got = str(exc)
    assert got == expected and got is not HttpxAiohttpClient


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the openssl command."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


async def _answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        body = b'{"ok": true}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n")
        writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass  # a client that refused our certificate hangs up during the handshake
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_ssl_cert_file_decides_which_certificates_are_trusted(tmp_path, store, monkeypatch) -> None:
    """SSL_CERT_FILE naming a self-signed certificate makes its HTTPS server trusted; without it, the call is refused."""
    cert, key = _self_signed(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)

    async def main(name: str) -> pd.DataFrame:
        server = await asyncio.start_server(_answer_ok, "127.0.0.1", 0, ssl=server_side)
        async with server:
            url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/check"
            check = pb.http_tool(name, method="GET", url=url, params={"q": "{q}"}, pick="ok", timeout=10)
            return await pd.DataFrame({"q": ["a"]}).play.amap(check, store=store, progress=False)

    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    trusted = asyncio.run(main("trusted"))
    assert trusted["play_status"].tolist() == ["ok"] and trusted["trusted"].tolist() == [True]
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    refused = asyncio.run(main("refused"))
    assert refused["play_status"].tolist() == ["failed"]
    assert "certificate" in refused["play_error"].iloc[0].lower()


# -- bounded connections -------------------------------------------------------------------------


@pytest.mark.slow
def test_connections_per_host_are_bounded_and_waiting_for_one_is_not_a_timeout(demo, store) -> None:
    """600 calls in flight to one host use at most PER_HOST connections; the rest queue, and the queue does not count against timeout=."""
    demo.reset(latency=1.0)
    # Seven waves of 1 s: the last waits 6 s for a connection, longer than the tool's timeout,
    # which leaves each answer 4 s of slack (a machine six times slower, opening the first wave's
    # connections at once, has used over two seconds of it).
    waves = 7
    tool = _company_tool(demo.url, timeout=5.0)
    frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(waves * PER_HOST)]})
    out = frame.play.map(tool, store=store, progress=False, concurrency=waves * PER_HOST)
    assert (out["play_status"] == "ok").all(), out["play_error"].dropna().head()
    stats = demo.stats()
    assert stats["requests"] == waves * PER_HOST and stats["max_in_flight"] <= PER_HOST


def test_concurrency_past_the_open_file_limit_warns(store) -> None:
    """concurrency beyond what the open-file limit leaves connections for runs, with a RuntimeWarning pointing at the caller."""
    budget = connection_budget()
    if budget is None:
        pytest.skip("this platform has no open-file limit to read")

    @pb.tool
    async def double(n: int) -> int:
        return 2 * n

    with pytest.warns(
        RuntimeWarning, match=rf"concurrency={budget + 1} is more calls in flight than .* open-file limit"
    ) as caught:
        out = pd.DataFrame({"n": [1, 2]}).play.map(
            double, store=store, progress=False, concurrency=budget + 1
        )
    assert out["double"].tolist() == [2, 4]
    [warning] = caught
    assert warning.filename == __file__  # the user's line, not playbook's
    assert f"concurrency={budget} or less" in str(warning.message) and "ulimit -n" in str(warning.message)


CHILD = """
import json, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
import pandas as pd, playbook as pb
url, store = sys.argv[1], sys.argv[2]
tool = pb.http_tool("demo.company", method="GET", url=url + "/v1/company", params={"domain": "{domain}"},
                    headers={"Authorization": "Bearer demo-key"})
frame = pd.DataFrame({"domain": [f"company{i}.com" for i in range(2000)]})
out = frame.play.map(tool, concurrency=10_000, progress=False, store=store)
print(json.dumps({"statuses": out["play_status"].value_counts().to_dict(), "errors": out["play_error"].dropna().head(3).tolist()}))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_ten_thousand_in_flight_under_ulimit_256(demo, tmp_path) -> None:
    """Under `ulimit -n 256`, 2,000 rows at concurrency=10_000 all end ok (calls queue for connections), and the warning says why it is slow."""
    env = {k: v for k, v in os.environ.items() if k.upper() not in PROXY_VARIABLES}
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), demo.url, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report == {"statuses": {"ok": 2000}, "errors": []}
    assert (
        "RuntimeWarning: concurrency=10000 is more calls in flight than this process's open-file limit (256)"
        in child.stderr
    )
    stats = demo.stats()
    assert stats["by_status"] == {"200": 2000} and stats["max_in_flight"] <= PER_HOST
