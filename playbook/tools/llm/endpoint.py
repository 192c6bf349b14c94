"""The chat completions endpoint as an HTTP engine, learning from each answer's headers: the
``x-ratelimit-limit-*`` limits a provider announces teach the provider's governor the limits
nobody configured (see :func:`~playbook.providers.limits.announced`)."""

from __future__ import annotations

import httpx

from playbook.providers.limits import announced
from playbook.tools.http import HttpEngine
from playbook.tools.protocol import CallEnv

__all__ = ["Endpoint"]


class Endpoint(HttpEngine):
    """The chat completions endpoint as an HTTP engine: errors classified as HTTP answers, and the
    limits the provider announces in each answer's headers passed on."""

    def heard(self, headers: httpx.Headers, call: CallEnv) -> None:
        found = announced(headers)
        if found is not None:
            call.announced = found
