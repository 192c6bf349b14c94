"""The demo provider's stand-in while fixtures are replayed (``$PLAYBOOK_FIXTURES``).

A notebook or script written against ``pb.demo.serve()`` then runs with no server at all (and
without the ``demo`` extra): every call is answered from the fixture file, so nothing would
reach the server anyway.  Its URL points nowhere (``.invalid`` never resolves), so a call the
fixtures lack cannot quietly go out; its counters stay at zero, which is what was sent.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from playbook.demo.counters import Counters
from playbook.demo.settings import DemoSettings

__all__ = ["OfflineDemo"]


class OfflineDemo:
    """What ``pb.demo.serve()`` returns while fixtures are replayed: no server, no requests."""

    url = "http://demo.invalid"
    running = False

    def __init__(self, fixtures: str, settings: DemoSettings) -> None:
        self.fixtures = fixtures
        self.settings = settings

    def __repr__(self) -> str:
        return f"<demo provider offline: calls are answered from the fixtures {self.fixtures}>"

    def stats(self) -> dict[str, Any]:
        """The request counters: all zero, since nothing is sent."""
        return Counters().snapshot()

    def reset(self, **settings: Any) -> DemoSettings:
        """Settings are checked as a server's are, and kept; nothing serves them."""
        self.settings = DemoSettings.from_kwargs(**settings)
        return self.settings

    def configure(self, **settings: Any) -> DemoSettings:
        self.settings = self.settings.replace(**settings)
        return self.settings

    def stop(self) -> None:
        """Nothing to stop."""

    def __enter__(self) -> OfflineDemo:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
