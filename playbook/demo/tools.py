"""Ready-made tools for the demo provider, for examples, tests and benchmarks."""

from __future__ import annotations

from typing import Any

from playbook.demo.server import DemoServer
from playbook.demo.settings import DEMO_KEY
from playbook.providers.provider import Provider
from playbook.tools import HttpTool, http_tool

__all__ = ["email_tool"]


def email_tool(
    server: DemoServer | str, *, provider: Provider | None = None, name: str = "demo.email", **options: Any
) -> HttpTool:
    """The demo's email finder as an ``http_tool``: inputs ``domain`` and ``first``; a 404 is a
    miss.  ``server`` is a running demo (or its URL); ``options`` override any ``http_tool`` option.
    On a provider that pools keys (``keys=``), each call sends the key the pool chose."""
    url = server if isinstance(server, str) else server.url
    settings: dict[str, Any] = {
        "method": "GET",
        "url": url + "/v1/email",
        "params": {"domain": "{domain}", "first": "{first}"},
        "headers": {
            "Authorization": "Bearer {secret}"
            if provider is not None and provider.keys is not None
            else f"Bearer {DEMO_KEY}"
        },
        "pick": "email",
        "miss_status": (404,),
        "provider": provider,
    }
    settings.update(options)
    return http_tool(name, **settings)
