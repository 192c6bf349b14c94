"""The token budgets of one account, each paced apart (:class:`Budgets`), charged what a call
weighs (a :class:`~playbook.providers.limits.weights.Tokens`: input and output apart).

Providers count tokens in different budgets: OpenAI and Azure one budget of input and output
together (``tpm``), Anthropic input and output tokens apart (``itpm``, ``otpm``).  A call is
charged its estimate in each budget the account has when it goes, and the difference when its
answer says what it used.  A provider that charges ``max_tokens`` when a request starts (Anthropic's
output budget, Azure's token budget) is paced by the same charge, then given back what the
answer did not use.

Like :class:`~playbook.providers.limits.pace.Pace` it reads no clock: each method takes ``now``.
"""

from __future__ import annotations

from playbook.providers.limits.pace import Pace
from playbook.providers.limits.weights import Rates, parts

__all__ = ["Budgets", "token_burst"]


def token_burst(rate: float) -> int:
    """Tokens are paced evenly, with at most half a second's worth at once: providers enforce a
    per-minute token limit over much shorter periods (a minute's worth sent at once is refused),
    and calls that leave evenly may still arrive together, or use more tokens than estimated."""
    return max(1, int(rate / 2))


def _pace(rate: float | None) -> Pace | None:
    return Pace(rate, token_burst(rate)) if rate is not None else None


class Budgets:
    """The token budgets of one account, each a :class:`Pace` of tokens a second (None: no such
    budget): ``tokens`` is charged a call's total, ``input`` its input, ``output`` its output."""

    __slots__ = ("tokens", "input", "output")

    def __init__(self, rates: Rates) -> None:
        self.tokens, self.input, self.output = (_pace(rate) for rate in rates)

    def __repr__(self) -> str:
        shown = [f"{name}={rate:.4g}/s" for name, rate in zip(Rates._fields, self.rates) if rate is not None]
        return f"<Budgets {' '.join(shown)}>"

    @property
    def rates(self) -> Rates:
        return Rates(
            *(pace.rate if pace is not None else None for pace in (self.tokens, self.input, self.output))
        )

    def _charged(self, weight: float) -> list[tuple[Pace, float]]:
        """Each budget with what ``weight`` counts in it."""
        input, output = parts(weight)
        units = ((self.tokens, input + output), (self.input, input), (self.output, output))
        return [(pace, n) for pace, n in units if pace is not None]

    def delay(self, now: float, weight: float) -> float:
        """Seconds until every budget has room for a call of ``weight``."""
        return max((pace.delay(now, n) for pace, n in self._charged(weight)), default=0.0)

    def take(self, now: float, weight: float, *, queued: bool = False) -> None:
        """Charge a call of ``weight`` sent at ``now`` to each budget."""
        for pace, n in self._charged(weight):
            pace.take(now, queued=queued, weight=n)

    def charge(self, weight: float, actual: float) -> bool:
        """A call charged ``weight`` used ``actual``: each budget is charged the difference (given
        back, when it used less).  True when a budget moved."""
        input, output = parts(weight)
        used_in, used_out = parts(actual)
        extra = ((self.tokens, used_in + used_out - input - output), (self.input, used_in - input))
        moved = False
        for pace, n in (*extra, (self.output, used_out - output)):
            if pace is not None and n:
                pace.charge(n)
                moved = True
        return moved

    def behind(self, queued: float, queued_out: float) -> float:
        """Seconds the tokens of the calls queued ahead (``queued`` in all, ``queued_out`` of them
        output) take to go, in the slowest budget."""
        units = ((self.tokens, queued), (self.input, queued - queued_out), (self.output, queued_out))
        return max((n / pace.rate for pace, n in units if pace is not None and pace.rate), default=0.0)

    def learn(self, rates: Rates) -> bool:
        """The provider announced budgets (tokens a second, headroom taken): each is paced at no
        more than that from now on (a budget it had none of is made).  True when one changed."""
        changed = False
        for name, rate in zip(Rates._fields, rates):
            if rate is None:
                continue
            pace: Pace | None = getattr(self, name)
            if pace is None:
                setattr(self, name, _pace(rate))
                changed = True
            elif pace.learn(rate):
                pace.burst = token_burst(rate)
                changed = True
        return changed
