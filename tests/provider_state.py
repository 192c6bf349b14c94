"""Put a real ``pb.Provider`` in the states the governor puts it in, for tests of what views show:
down (why, the next probe) or up again, and holding its calls after a 429."""

from __future__ import annotations

import asyncio
import contextlib

import playbook as pb
from playbook.providers.provider import governor


def set_down(provider: pb.Provider, error: str | None, probe_at: float = 0.0) -> None:
    """What the governor sets when a provider refuses connections (down, why, the next probe in epoch
    seconds), or, with no error, when a probe went through."""
    gov = governor(provider)
    gov.health.down = error is not None  # ``down`` is read from the provider's health
    gov.down_error, gov.probe_at = error, probe_at


def hold(provider: pb.Provider, seconds: float) -> None:
    """The provider answers a call with 429 and Retry-After: ``seconds``, so it holds its calls (the
    call itself gives up at once when ``seconds`` is past the provider's max_wait)."""

    async def refused() -> None:
        raise pb.ToolError("daily quota exceeded", status=429, retry_after=seconds)

    async def send() -> None:
        with contextlib.suppress(pb.ProviderExhausted):
            await governor(provider).dispatch(refused)

    asyncio.run(send())
