"""Rows parked on a down provider come back within the run when it does.

Rows wait for a down provider's probes within their wait budget, then park.  But a run that goes
on for other rows should not leave them parked when the provider is back later: at the
provider's next probe time one of them is admitted again as the probe (only that: it does not
wait for the provider again, so a provider that stays down does not keep the run going), and
when a probe goes through (``ProviderUp``) all of them are, waiting afresh.  A run that has
nothing else to do ends with them parked; ``run.retry()`` or a rerun probes the provider at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from playbook.runtime.state.upstream import is_down, probe_due

if TYPE_CHECKING:
    from playbook.providers.provider import Provider

__all__ = ["DownRows"]


class DownRows:
    """Rows parked "down", per provider, while one execution runs."""

    __slots__ = ("_rows", "_timers", "_readmit", "_running")

    def __init__(self, readmit: Callable[[list[int], str | None], None], running: Callable[[], bool]) -> None:
        self._rows: dict[str, list[int]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # put these rows back into the execution under way (as that provider's probe, when named)
        self._readmit = readmit
        self._running = running  # is the execution still going (and not stopping)?

    def __repr__(self) -> str:
        return f"<DownRows {sum(map(len, self._rows.values()))} rows on {sorted(self._rows)}>"

    def parked(self, pos: int, provider: Provider) -> None:
        """A row parked on ``provider`` being down: bring one back as the probe when it is due."""
        if not is_down(provider):
            return  # parked on word from elsewhere (a tool's own error): no probe of ours to wait for
        self._rows.setdefault(provider.name, []).append(pos)
        if provider.name not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[provider.name] = loop.call_at(
                probe_due(provider, loop.time()), self._probe, provider
            )

    def _probe(self, provider: Provider) -> None:
        self._timers.pop(provider.name, None)
        rows = self._rows.get(provider.name)
        if rows and self._running():
            # parks again (and comes back here) if it is still down
            self._readmit([rows.pop(0)], provider.name)

    def up(self, name: str) -> None:
        """The provider took a call again: every row parked on it goes back into the run."""
        rows = self._rows.pop(name, None)
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        if rows and self._running():
            self._readmit(rows, None)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._rows.clear()
