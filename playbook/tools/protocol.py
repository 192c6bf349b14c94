"""What the call pipeline asks of a tool: the :class:`ToolEngine` protocol, and the values that
cross it (:class:`CallEnv` going in, :class:`Spent` coming back).

A user holds a :class:`~playbook.tools.tool.Tool`: its name, version, inputs and how to call it.
Behind it sits its *engine*, which the pipeline reaches through
:func:`~playbook.tools.tool.engine_of` and never through the user's object, as httpx's
``Client`` sits over a ``BaseTransport``.  Each kind of tool has its engine: a Python function
(plain or batch, :mod:`.engine`), one HTTP request (:mod:`.http`), a chat completion
(:mod:`.llm`).  A new kind of tool implements this protocol, usually by subclassing
:class:`~playbook.tools.engine.Engine`, whose defaults fit a tool that calls nothing remote.

What ``await ctx.tool(t, ...)`` asks of ``engine_of(t)``, in order::

    bind         the call's input values, from what the play passed
    address      the receipt's address of those values (looked up; leased; written)
    read         what the play gets from an answer: on a receipt hit and after a paid call
    spent        what an answer cost (counted on a hit too, as ``cost_saved``)
    submits      a call answered later by a batch job (the row sleeps) rather than sent now
    price        the cost reserved against ``max_cost`` before the call is sent
    weigh        the tokens the call is expected to use (a provider paced by ``tpm``)
    invoke       one try of the call; ``invoke_batch`` for a tool with a ``batch_size``
    stored_input the input as the receipt keeps it
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import httpx

    from playbook.providers.limits import Announced
    from playbook.providers.provider import Provider

__all__ = ["NO_INPUT", "CallEnv", "Spent", "ToolEngine", "is_local"]

NO_INPUT: Any = object()  # "no positional input": None is a valid input


class Spent(NamedTuple):
    """What one paid answer cost: money (in the tool's own unit; ``None``: unpriced, an LLM
    whose model has no price, never counted as 0), tokens (``None``: not counted; an LLM's answer
    says :class:`~playbook.providers.limits.Tokens`, input and output apart, a number of them in
    all), requests (an answer that needed a re-ask took two), the part of the money that bought
    an answer validation refused (the first of a re-asked pair), and what the answer would have
    cost asked online (``None``: the same; a batch job's answer costs less)."""

    cost: float | None
    tokens: float | None
    requests: int
    refused: float = 0.0
    online: float | None = None


class CallEnv:
    """What a tool needs from the run to make one call, and what it tells back: the limits its
    provider announced in the answer (``announced``: requests and tokens per minute, each budget)."""

    __slots__ = ("client", "idempotency_key", "announced", "partial")

    def __init__(self, client: Callable[[], httpx.AsyncClient], idempotency_key: str) -> None:
        self.client = client
        self.idempotency_key = idempotency_key
        self.announced: Announced | None = None
        # What a try got before it failed, kept for the next try of the same call (an LLM
        # answer whose re-ask failed is not asked for again).
        self.partial: Any = None


class ToolEngine(Protocol):
    """The engine side of a tool: what the pipeline reads and calls (see the module docstring)."""

    @property
    def name(self) -> str:
        """The tool's name: in its receipts, its errors and the run's counts."""
        ...

    @property
    def version(self) -> str | None:
        """The version the user pinned, if any."""
        ...

    @property
    def identity(self) -> str:
        """The tool's part of every receipt address (and the ``version`` a receipt records)."""
        ...

    @property
    def fingerprint(self) -> str:
        """All that shapes what a play gets back: a row memo made under another one is not reused."""
        ...

    @property
    def account(self) -> str:
        """The provider account this tool's receipts belong to."""
        ...

    @property
    def provider(self) -> Provider | None:
        """The provider whose governor paces its calls (None: sent at once)."""
        ...

    @property
    def remote(self) -> bool:
        """Does a call leave the process (and so count as paid, with or without a cost)?"""
        ...

    @property
    def batch_size(self) -> int | None:
        """Calls coalesced across rows into one :meth:`invoke_batch` of up to this many (None: one by one)."""
        ...

    @property
    def retry_on(self) -> tuple[type[Exception], ...]:
        """Exception types the provider retries, besides those that carry an HTTP answer."""
        ...

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names of its inputs (a tool mapped over a frame binds them from columns)."""
        ...

    @property
    def defaults(self) -> Mapping[str, Any]:
        """An input's default, for a call that does not pass it."""
        ...

    def bind(self, input: Any, kwargs: Mapping[str, Any]) -> Any:
        """Called first, for each call a play makes: its input values from a positional input
        and/or keywords (a ToolError naming the tool when they do not fit)."""
        ...

    def address(self, values: Any) -> str:
        """Called with the bound values before the store is asked: the receipt's address
        (``Unencodable`` when a value has no JSON form).  It must not change between releases:
        users' stores answer by it."""
        ...

    def stored_input(self, values: Any) -> Any:
        """Called when a receipt is written: the input as the receipt keeps it."""
        ...

    def read(self, answer: Any, miss: bool) -> tuple[Any, bool]:
        """Called with each answer a play is given, stored or new: ``(value, miss)`` as the play
        gets it (an HTTP tool picks from the stored JSON here)."""
        ...

    def submits(self) -> bool:
        """Asked for a call that missed its receipt: is it submitted as a batch job, answered
        later, rather than sent now?"""
        ...

    def weigh(self, values: Any) -> float | None:
        """Asked before a call goes through its provider's governor: the tokens it is expected
        to use, a :class:`~playbook.providers.limits.Tokens` to count input and output apart (None:
        it is weighed as one request)."""
        ...

    def price(self, values: Any) -> float | None:
        """Asked before a call is sent under ``max_cost``: the cost reserved for it (``None``: it
        has no price, and ``max_cost`` cannot count it)."""
        ...

    def spent(self, answer: Any) -> Spent:
        """Asked of each answer, paid now or read from a receipt: what it cost (the same each
        time it is replayed)."""
        ...

    async def invoke(self, values: Any, call: CallEnv) -> tuple[Any, bool]:
        """One try of a call that missed its receipt: ``(answer, miss)``.  Its exceptions are
        classified by the pipeline (a ToolError as it says; an SDK's HTTP errors as HTTP answers)."""
        ...

    async def invoke_batch(self, items: list[Any]) -> list[Any]:
        """One try of a batch of calls (a tool with a ``batch_size``): one answer or exception per item."""
        ...


def is_local(tool: ToolEngine, cost: float | None) -> bool:
    """A call that costs nothing and goes nowhere (a plain Python tool): counted apart from paid ones."""
    return tool.provider is None and cost is not None and not cost and not tool.remote
