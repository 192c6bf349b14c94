"""How a run's waterfalls went, leg by leg: what ``run.waterfalls`` and the panel show."""

from __future__ import annotations

from typing import Any

from playbook.events import WaterfallFinished

__all__ = ["LEG_COLUMNS", "Legs"]

LEG_COLUMNS = ["waterfall", "leg", "tool", "hits", "misses", "unavailable", "errors", "never_reached"]
_COLUMN = {
    "hit": 1,
    "miss": 2,
    "unavailable": 3,
    "error": 4,
    "never": 5,
}  # an outcome's place in a leg's counts


class Legs(dict[str, list[list[Any]]]):
    """Per waterfall (its key): per leg, its tool and how many rows it answered (hit), missed,
    found unavailable, failed, or never reached."""

    def count(self, event: WaterfallFinished) -> None:
        """A row's waterfall ended: each leg's outcome counts (a waterfall whose legs changed starts
        again)."""
        legs = self.get(event.key)
        if legs is None or [leg[0] for leg in legs] != list(event.tools):
            legs = self[event.key] = [[tool, 0, 0, 0, 0, 0] for tool in event.tools]
        for leg, outcome in zip(legs, event.outcomes):
            leg[_COLUMN[outcome]] += 1

    def rows(self) -> list[list[Any]]:
        """One row per leg, in ``LEG_COLUMNS`` order."""
        return [[key, i, *leg] for key, legs in self.items() for i, leg in enumerate(legs)]
