"""One attempt of one row: the play runs with a fresh ``ctx``, and how it ends becomes the row's
outcome (ok and memoised, held, sleeping, parked, failed, or fatal for the run)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from playbook._internal.flow import Leased, OnHold, Parked, Sleeping, Suspend
from playbook.errors import ProviderExhausted, RunFatal
from playbook.plays.play import Play
from playbook.runtime.calls.context import Context, ledger
from playbook.runtime.calls.scope import RunScope
from playbook.runtime.rows.frames import error_line, error_message, row_output
from playbook.runtime.rows.grouping import error_group, safe_str
from playbook.runtime.rows.memos import remember
from playbook.runtime.schedule.outcomes import Outcomes

if TYPE_CHECKING:
    from playbook.store import StoreEngine

__all__ = ["RowRunner"]


class RowRunner:
    """Runs rows of one run: ``await runner(position)``."""

    __slots__ = ("play", "scope", "outcomes", "store", "_raise", "_fail_run")

    def __init__(
        self,
        play: Play,
        scope: RunScope,
        outcomes: Outcomes,
        store: StoreEngine,
        *,
        on_error: str,
        fail_run: Callable[[BaseException], None],
    ) -> None:
        self.play = play
        self.scope = scope
        self.outcomes = outcomes
        self.store = store
        self._raise = on_error == "raise"  # a failed row fails the run
        self._fail_run = fail_run  # the run stops and raises this when it ends

    def __repr__(self) -> str:
        return f"<RowRunner {self.play.name!r}>"

    async def __call__(self, pos: int) -> bool:
        """One attempt of the row at ``pos``; True if it stepped aside (held, sleeping)."""
        outcomes = self.outcomes
        table = outcomes.table
        # rows that run have keys
        ctx = Context(self.scope, table.key(pos), pos, outcomes.started(pos))  # type: ignore[arg-type]
        book = ledger(ctx)
        try:
            play = self.play
            output, stored = row_output(play, await play.fn(table.row(pos), ctx), book)
        except OnHold as held:
            held.budget.left -= max(0.0, held.until - asyncio.get_running_loop().time())
            outcomes.hold(pos, held.until, held.wall, held.provider.name, held.status, behind=held.behind)
            return True
        except Sleeping as sleeping:
            outcomes.sleep(pos, sleeping.until, sleeping.wall)
            return True
        except Leased:
            outcomes.step_back(pos)
            return False  # its worker takes the next fresh row
        except Parked as park:
            outcomes.park(pos, park.reason, str(park), park.provider, park.ready_at)
        except ProviderExhausted as exc:
            outcomes.park(pos, exc.reason, error_message(exc), exc.provider, exc.retry_at)
        except RunFatal as exc:
            outcomes.finish(
                pos,
                "failed",
                None,
                error_message(exc),
                group=error_group(exc, self.play.fn),
                cost_failed=book.paid,
            )
            self.scope.fatal_stop(exc)
        except Suspend:  # pragma: no cover - every signal is handled above
            raise
        except Exception as exc:
            if "'coroutine'" in safe_str(exc) and (advice := book.never_awaited()) is not None:
                exc.add_note(advice)  # v = ctx.tool(...) then v.upper(): the value was never awaited
            self._failed(pos, exc, book.paid)
        else:
            outcomes.finish(pos, "ok", output, None, cost_failed=book.refused)
            if stored is not None:
                remember(
                    self.store,
                    self.play,
                    book.row_id,
                    output,
                    stored,
                    (book.calls, book.cost, book.tools, book.receipts, book.local, book.unpriced),
                )
        finally:
            book.close()
        return False

    def _failed(self, pos: int, exc: Exception, paid: float) -> None:
        fn = self.play.fn
        self.outcomes.finish(
            pos,
            "failed",
            None,
            error_message(exc) + error_line(exc, fn),
            group=error_group(exc, fn),
            cost_failed=paid,
        )
        if self._raise:
            exc.add_note(
                f"in row {self.outcomes.table.label(pos)!r} (position {pos}) of play {self.play.name!r}"
            )
            self._fail_run(exc)
