"""The engine of a tool (see :mod:`.protocol`), and what makes two tools the same tool.

A tool's *input* is a mapping of its input names to values.  Its *identity* is part of every
receipt address: the ``version=`` the user pinned, or else a fingerprint of the function's code,
so an edited tool is a new tool (as with joblib.Memory) and never answers from the old one's
receipts.  Its *fingerprint* covers everything that shapes what a play gets back (for an HTTP
tool, also ``pick``): a row memo made with another fingerprint of a tool is not reused.

:class:`Engine` is the engine of a ``@pb.tool`` function (plain, or batch with ``batch_size``),
and the base of the HTTP and LLM engines, which override what they do differently.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from playbook.addresses import ReceiptAddresses, code_fingerprint, digest, key_text
from playbook.errors import PlaybookError, PlayDefinitionError, ToolError
from playbook.plays.play import defined
from playbook.providers.provider import Provider
from playbook.tagged import encode
from playbook.tools.failures import translate
from playbook.tools.protocol import NO_INPUT, CallEnv, Spent

__all__ = ["CALL_OPTIONS", "Engine"]

# The keywords ctx.tool() takes besides a tool's inputs (ctx.leg() takes the first two): a misspelt
# one reaches the tool as an input, and is told its near spelling.
CALL_OPTIONS = ("refresh", "ttl", "on_exhausted")

_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")


class Engine:
    """The engine of a ``@pb.tool`` function, plain or batch (see :class:`~.protocol.ToolEngine`),
    and the defaults of every engine: a call that goes nowhere remote, costs the tool's ``cost``
    and is answered by its function."""

    remote = False  # does a call leave the process (and so count as paid, with or without a cost)?

    __slots__ = (
        "name",
        "version",
        "identity",
        "fingerprint",
        "provider",
        "cost",
        "batch_size",
        "retry_on",
        "inputs",
        "fn",
        "_is_async",
        "_input_set",
        "_spent",
        "_addresses",
        "defaults",
    )

    def __init__(
        self,
        name: str,
        *,
        inputs: Sequence[str],
        fn: Callable[..., Any] | None = None,
        version: str | None = None,
        provider: Provider | None = None,
        cost: float = 0.0,
        batch_size: int | None = None,
        retry_on: type[Exception] | tuple[type[Exception], ...] = (),
        identity: str | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise PlayDefinitionError(
                f"tool name {name!r} must start with a letter and use letters, digits, '.', '-' or '_'"
            )
        if (
            isinstance(cost, bool)
            or not isinstance(cost, (int, float))
            or not cost >= 0
            or cost == float("inf")
        ):
            raise PlayDefinitionError(f"tool {name!r}: cost must be a finite number >= 0, not {cost!r}")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise PlayDefinitionError(
                f"tool {name!r}: batch_size must be a whole number >= 1, not {batch_size!r}"
            )
        if provider is not None and not isinstance(provider, Provider):
            raise PlayDefinitionError(
                f"tool {name!r}: provider must be a pb.Provider, not {type(provider).__name__}"
            )
        if fn is not None and provider is not None and provider.keys is not None:
            raise PlayDefinitionError(
                f"tool {name!r}: provider {provider.name!r} pools keys (keys=), which only pb.http_tool and pb.llm_tool send (as "
                "their {secret} or bearer token); a Python tool cannot be told which key a call goes under: give it a provider "
                "without keys=, or make it a pb.http_tool"
            )
        if version is not None and (
            not isinstance(version, (str, int)) or isinstance(version, bool) or str(version) == ""
        ):
            raise PlayDefinitionError(
                f"tool {name!r}: version must be a non-empty string (or int), not {version!r}"
            )
        self.name = name
        self.version = None if version is None else str(version)
        self.provider = provider
        self.cost = float(cost)
        self._spent = Spent(self.cost, None, 1)  # every answer of a plain tool costs the same
        self._addresses: ReceiptAddresses | None = None  # made at its first call (address)
        self.batch_size = batch_size
        # Part of the definition, not of the identity: how often a call is tried changes no answer.
        self.retry_on = _retry_types(name, retry_on)
        self.inputs = tuple(inputs)
        self._input_set = frozenset(self.inputs)
        # An input's default, for a call that does not pass it: part of the call's input (its
        # receipt's address), as if passed, so passing it or not is the same call.
        self.defaults = dict(defaults or {})
        self.fn = fn
        self._is_async = fn is not None and inspect.iscoroutinefunction(fn)
        if identity is None:
            identity = self.version if self.version is not None else "src:" + code_fingerprint(fn)[:16]
        self.identity = identity
        self.fingerprint = self._definition()
        defined(name, self.fingerprint)

    def _definition(self) -> str:
        """The fingerprint row memos check (see the module docstring): 16 hex digits."""
        return digest(self.identity)[:16]

    @property
    def account(self) -> str:
        """The provider account this tool's receipts belong to."""
        return self.provider.account if self.provider is not None else "default"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.identity}>"

    def bind(self, input: Any, kwargs: Mapping[str, Any]) -> Any:
        """The call's input as ``{param: value}``, from a positional input and/or keywords.

        A batch tool's input is one item of its list: the positional input, or the keywords.
        """
        if self.batch_size is not None:
            if input is NO_INPUT:
                return dict(kwargs)
            if kwargs:
                raise ToolError(
                    f"batch tool {self.name!r}: pass one input, or keywords, not both", tool=self.name
                )
            return input
        if input is NO_INPUT and kwargs.keys() == self._input_set:
            return dict(kwargs)  # the common case, checked in one comparison
        one = self.inputs[0] if len(self.inputs) == 1 else None
        if input is NO_INPUT:
            values = dict(kwargs)
        elif one is not None and not kwargs and not (isinstance(input, Mapping) and set(input) == {one}):
            values = {one: input}
        elif isinstance(input, Mapping):
            values = {**input, **kwargs}
        else:
            raise ToolError(
                f"tool {self.name!r} takes ({', '.join(self.inputs)}): pass them by keyword or as one mapping",
                tool=self.name,
            )
        if self.defaults and len(values) < len(self.inputs):
            values = {**values, **{p: v for p, v in self.defaults.items() if p not in values}}
        unknown = [k for k in values if k not in self.inputs]
        missing = [p for p in self.inputs if p not in values]
        if unknown or missing:
            parts = []
            if missing:
                parts.append("missing " + ", ".join(missing))
            if unknown:
                parts.append("unexpected " + ", ".join(unknown))
            raise ToolError(
                f"tool {self.name!r} takes ({', '.join(self.inputs)}): {'; '.join(parts)}"
                + _near(unknown, missing or self.inputs),
                tool=self.name,
            )
        return values

    def address(self, values: Any) -> str:
        """The receipt address of a call with these input values (``Unencodable`` if one has no JSON form)."""
        addresses = self._addresses
        if addresses is None:  # once per tool, at its first call: its identity and account are settled
            addresses = self._addresses = ReceiptAddresses(self.name, self.identity, self.account)
        return addresses(key_text(values))

    def stored_input(self, values: Any) -> Any:
        """The input as its receipt keeps it."""
        return encode(values)

    def read(self, answer: Any, miss: bool) -> tuple[Any, bool]:
        """What a play gets from a stored answer: the answer itself (an HTTP tool picks from it)."""
        return answer, miss

    def submits(self) -> bool:
        """Are this tool's calls submitted as batch jobs (answered later) rather than sent?"""
        return False

    def weigh(self, values: Any) -> float | None:
        """The tokens a call with these inputs is expected to use (``None``: not weighed by tokens)."""
        return None

    def price(self, values: Any) -> float | None:
        """The cost reserved against ``max_cost`` before a call with these inputs is sent."""
        return self.cost

    def spent(self, answer: Any) -> Spent:
        """What an answer cost, as stored in its receipt: the same when it is replayed."""
        return self._spent

    async def invoke(self, values: Any, call: CallEnv) -> tuple[Any, bool]:
        """Run the tool once; returns ``(answer, miss)``.  Python tools: ``None`` is a miss."""
        fn = self.fn
        assert fn is not None
        if self._is_async:
            out = await fn(**values)
        else:
            # Sync tools run in a worker thread so a slow one never blocks the loop.
            out = await asyncio.to_thread(functools.partial(fn, **values))
        return out, out is None

    async def invoke_batch(self, items: list[Any]) -> list[Any]:
        """Run a batch tool on a list of inputs; returns one answer (or exception) per input."""
        fn = self.fn
        assert fn is not None
        try:
            outs = await fn(items) if self._is_async else await asyncio.to_thread(fn, items)
        except PlaybookError:
            raise
        except Exception as exc:
            # The batch's own failure goes to the governor, which understands ToolErrors.
            error = translate(
                exc,
                tool=self.name,
                provider=self.provider.name if self.provider else None,
                retry_on=self.retry_on,
            )
            if error is None:
                raise
            raise error from exc
        if not isinstance(outs, (list, tuple)) or len(outs) != len(items):
            got = f"{len(outs)} outputs" if isinstance(outs, (list, tuple)) else f"a {type(outs).__name__}"
            raise ToolError(
                f"batch tool {self.name!r} returned {got} for {len(items)} inputs; it must return a list, one output per input",
                tool=self.name,
            )
        return list(outs)


def _retry_types(name: str, retry_on: Any) -> tuple[type[Exception], ...]:
    """``retry_on`` as a tuple of exception classes, or a PlayDefinitionError naming the tool."""
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    for kind in types:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise PlayDefinitionError(
                f"tool {name!r}: retry_on must be an exception class or a tuple of them, e.g. retry_on=(TimeoutError,), not {retry_on!r}"
            )
        if issubclass(kind, PlaybookError):
            raise PlayDefinitionError(
                f"tool {name!r}: retry_on={kind.__name__} has no effect: playbook's own errors say themselves whether to retry"
            )
    return types


def _near(unknown: list[str], inputs: Sequence[str]) -> str:
    """Did-you-mean for each unexpected keyword: a near input of the tool, else a near option of
    ``ctx.tool()`` (``refesh=`` was meant for the call, not the tool)."""
    hints = []
    for wrong in unknown:
        if close := difflib.get_close_matches(wrong, inputs, n=1):
            hints.append(f"; did you mean {close[0]!r} for {wrong!r}?")
        elif close := difflib.get_close_matches(wrong, CALL_OPTIONS, n=1):
            hints.append(f"; did you mean {close[0]}= (an option of ctx.tool) for {wrong!r}?")
    return "".join(hints)
