"""A deterministic fake enrichment provider on loopback, for tests, notebooks and benchmarks.

    >>> import playbook as pb
    >>> with pb.demo.serve(rps=5, burst=5) as demo:
    ...     demo.url                                  # 'http://127.0.0.1:54321'
    ...     demo.stats()["requests"]

It is a real HTTP server (Starlette on uvicorn) with per-key rate limits, 429 +
Retry-After, quotas, latency, fault injection, async jobs, an OpenAI-compatible chat
endpoint and request counters. `python -m playbook.demo --port 0` runs it in the
foreground of another process; `pb.demo.serve(in_process=True)` serves it without a socket,
at `http://demo.local`, to the runs of this process. Nothing here reaches the internet.

Importing this package is cheap: Starlette and uvicorn (the `demo` extra) are imported
only when a server starts.
"""

from __future__ import annotations

from playbook.demo.data import leads
from playbook.demo.server import DemoServer, serve
from playbook.demo.settings import DEMO_KEY, DemoSettings
from playbook.demo.tools import email_tool

__all__ = ["DEMO_KEY", "DemoServer", "DemoSettings", "email_tool", "leads", "serve"]
