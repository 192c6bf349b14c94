"""The exceptions playbook raises, as one tree.

::

    PlaybookError                  anything playbook raises on purpose
    ├── ToolError                  a tool call failed (status, retryable, retry_after, provider, tool)
    │   └── ProviderUnavailable    the provider cannot answer now (retries used up)
    │       └── ProviderExhausted  the provider is held past the wait budget (retry_at)
    ├── RunFatal                   bad credentials, no credit, missing secret: the run stops
    ├── PlayDefinitionError        the play or its options are wrong before any row runs
    └── ReceiptError               the receipt store cannot be read or written

A blocking run stopped by Ctrl-C raises a plain ``KeyboardInterrupt`` (see :func:`interrupted`).

Third-party errors (httpx, sqlite3, json) are translated where they enter, so user code
only ever catches these.  Internal control flow (a held row, a stopped run) is *not* an
``Exception`` subclass: ``except Exception`` in a play cannot swallow it.

Every message names what is at fault: the row, the tool, the provider or the option.
In IPython, the ``_render_traceback_`` hook shows the message without a stack.
"""

from __future__ import annotations

__all__ = [
    "PlayDefinitionError",
    "PlaybookError",
    "ProviderExhausted",
    "ProviderUnavailable",
    "ReceiptError",
    "RunFatal",
    "ToolError",
    "interrupted",
]


class PlaybookError(Exception):
    """Base of every error playbook raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing a stack: the message is the whole story.
        lines = [f"{type(self).__name__}: {self}"]
        lines += getattr(self, "__notes__", [])
        return lines


class ToolError(PlaybookError):
    """A tool call failed.  ``retryable`` says whether trying again could help; ``retry_after``
    is the wait (seconds) the provider asked for, if it said.

    A Python tool may raise it too, e.g. ``ToolError("slow down", status=429, retry_after=30)``
    from an SDK's rate-limit error: the provider's governor then holds and retries as for HTTP.

    ``quota`` names a quota no retry beats before it resets (Gemini's per-day
    ``GenerateRequestsPerDayPerProjectPerModel-FreeTier``); ``retry_after`` is then the seconds
    until that reset.  The governor holds the provider until then and parks the rows at once
    (:class:`ProviderExhausted` naming the quota), never retrying.
    """

    def __init__(
        self,
        message: str,
        *,
        tool: str | None = None,
        provider: str | None = None,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        quota: str | None = None,
    ) -> None:
        super().__init__(message)
        self.tool = tool
        self.provider = provider
        self.status = status
        self.retryable = retryable or status == 429
        self.retry_after = retry_after
        self.quota = quota
        # (as sent, as written): a part of the message an error group keeps as the tool wrote it
        self.literal: tuple[str, str] | None = None
        # The request's own failure, never its provider's (a host the row chose answered or failed):
        # retried as ``retryable`` says, it neither holds the provider nor counts toward its health.
        self.own = False


class ProviderUnavailable(ToolError):
    """The provider could not answer now; a waterfall passes to its next leg."""


class ProviderExhausted(ProviderUnavailable):
    """The provider is on hold until ``retry_at`` (epoch seconds), past the wait budget, or it is
    down (``reason="down"``: it refuses connections or keeps failing; ``retry_at`` is when the next
    probe goes), or a quota no retry beats is spent (``reason="quota: <its name>"``; ``retry_at``
    is its reset).  A row that meets it parks with that reason; a waterfall tries its next leg."""

    def __init__(
        self, message: str, *, retry_at: float | None = None, reason: str = "hold", **kwargs: object
    ) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.retry_at = retry_at
        self.reason = reason


class RunFatal(PlaybookError):
    """Stops the whole run: bad credentials (401/403), no credit (402), a missing secret.
    ``denied``: the key was refused (a 401, a 403, or a provider's own way of saying it, as
    Gemini's 400 ``API_KEY_INVALID``): a pool of keys retires that key and goes on."""

    def __init__(
        self,
        message: str,
        *,
        tool: str | None = None,
        provider: str | None = None,
        status: int | None = None,
        denied: bool = False,
    ) -> None:
        super().__init__(message)
        self.tool = tool
        self.provider = provider
        self.status = status
        self.denied = denied or status in (401, 403)


class PlayDefinitionError(PlaybookError, TypeError):
    """The play, a tool definition or a run option is wrong; raised before any row runs."""


class ReceiptError(PlaybookError):
    """The receipt store cannot be opened, read or written (corrupt, newer format, read-only)."""


def interrupted(message: str) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` a blocking run raises once Ctrl-C has stopped it.

    A plain one, not a subclass: Python exits with the interrupted status (130) only for that
    class, so a script run by cron or CI reports the interrupt as such.  It carries IPython's
    ``_render_traceback_`` hook itself, so a notebook shows one line, not a stack.
    """
    exc = KeyboardInterrupt(message)
    exc._render_traceback_ = lambda: [f"KeyboardInterrupt: {message}"]  # type: ignore[attr-defined]
    return exc
