"""An LLM tool's endpoint as an HTTP engine, in its dialect: the limits a provider announces in
each answer's headers teach the provider's governor the limits nobody configured (see
:func:`~playbook.providers.limits.announced`), a refusal's body is read as the dialect defines it
(a wait said only there, a quota spent for the day, a key refused in another status than 401), and a dialect that signs its requests
(Bedrock's SigV4) signs them."""

from __future__ import annotations

import time
from typing import Any

import httpx

from playbook.errors import PlaybookError, ToolError
from playbook.providers.limits import announced
from playbook.tools.http import HttpEngine
from playbook.tools.llm.dialects import Dialect, Target
from playbook.tools.protocol import CallEnv

__all__ = ["Endpoint"]


class Endpoint(HttpEngine):
    """An LLM tool's endpoint (see the module docstring)."""

    __slots__ = ("dialect", "target", "_signer")

    def __init__(self, name: str, *, dialect: Dialect, target: Target, **http: Any) -> None:
        self.dialect, self.target = dialect, target
        self._signer: httpx.Auth | None = None
        super().__init__(name, **http)

    def heard(self, headers: httpx.Headers, call: CallEnv) -> None:
        found = announced(headers)
        if found is not None:
            call.announced = found

    def denied(self, status: int, content: bytes) -> bool:
        return self.dialect.denied(status, content)

    def refused(self, error: ToolError, content: bytes, headers: httpx.Headers) -> PlaybookError:
        return self.dialect.refused(error, content, headers, time.time())

    def signer(self) -> httpx.Auth | None:
        if self._signer is None:
            self._signer = self.dialect.signer(self.target)  # made once: it holds the credential chain
        return self._signer
