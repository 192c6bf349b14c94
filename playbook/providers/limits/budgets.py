"""The token budgets of one account, each paced apart (:class:`Budgets`), charged what a call
weighs (a :class:`~playbook.providers.limits.weights.Tokens`: input and output apart).

Providers count tokens in different budgets: OpenAI and Azure one budget of input and output
together (``tpm``), Anthropic input and output tokens apart (``itpm``, ``otpm``).  A call is
charged its estimate in each budget the account has when it goes, and the difference when its
answer says what it used.  Output a provider reserves when a request starts (Anthropic's
``max_tokens``) is held while the call is in flight and given back when it is answered; output a
provider counts on arrival whatever the answer uses (Azure's ``max_tokens``) stays charged.

Like :class:`~playbook.providers.limits.pace.Pace` it reads no clock: each method takes ``now``.
"""

from __future__ import annotations

from playbook.providers.limits.pace import Pace
from playbook.providers.limits.weights import Rates, parts, reserved, settled

__all__ = ["MINUTE", "Budgets", "token_burst"]


def token_burst(rate: float) -> int:
    """Tokens are paced evenly, with at most half a second's worth at once: providers enforce a
    per-minute token limit over much shorter periods (a minute's worth sent at once is refused),
    and calls that leave evenly may still arrive together, or use more tokens than estimated."""
    return max(1, int(rate / 2))


MINUTE = 60.0  # seconds of a budget its provider's bucket holds (Anthropic's: the limit per minute)


def _pace(rate: float | None) -> Pace | None:
    return Pace(rate, token_burst(rate)) if rate is not None else None


class Budgets:
    """The token budgets of one account, each a :class:`Pace` of tokens a second (None: no such
    budget): ``tokens`` is charged a call's total, ``input`` its input, ``output`` its output.

    Output a provider reserves (``max_tokens``, held while the call is in flight: Anthropic's) is
    charged like the rest, but what the calls in flight hold of it beyond what their answers are
    expected to use does not keep the next call waiting, up to what the provider's bucket holds
    (a minute's worth): what answers use is paced, half a second's worth at once, and the
    reservations are the provider's to hold.  Without that, a call reserving more than the
    answers of one latency use would go only once the one before it was answered.  A schedule
    that refunds took into the past restarts from now with the reservations still in it.
    """

    __slots__ = ("tokens", "input", "output", "_held")

    def __init__(self, rates: Rates) -> None:
        self.tokens, self.input, self.output = (_pace(rate) for rate in rates)
        self._held = 0.0  # output the calls in flight reserved

    def __repr__(self) -> str:
        shown = [f"{name}={rate:.4g}/s" for name, rate in zip(Rates._fields, self.rates) if rate is not None]
        return f"<Budgets {' '.join(shown)}>"

    @property
    def rates(self) -> Rates:
        return Rates(
            *(pace.rate if pace is not None else None for pace in (self.tokens, self.input, self.output))
        )

    def _charged(self, weight: float) -> list[tuple[Pace, float, float]]:
        """Each budget with what ``weight`` counts in it and the room reservations in flight give it."""
        input, output = parts(weight)
        held = self._held + reserved(weight)  # its own reservation too: only the answers' use waits
        units = ((self.tokens, input + output, held), (self.input, input, 0.0), (self.output, output, held))
        return [(pace, n, _room(pace, room)) for pace, n, room in units if pace is not None]

    def delay(self, now: float, weight: float) -> float:
        """Seconds until every budget has room for a call of ``weight``."""
        return max((pace.delay(now, n, room) for pace, n, room in self._charged(weight)), default=0.0)

    def take(self, now: float, weight: float, *, queued: bool = False) -> None:
        """Charge a call of ``weight`` sent at ``now`` to each budget."""
        held = self._held
        for pace, n, room in self._charged(weight):
            pace.take(now, queued=queued, weight=n, room=room, held=held if pace is not self.input else 0.0)
        self._held += reserved(weight)

    def charge(self, weight: float, actual: float) -> bool:
        """A call charged ``weight`` was answered, using ``actual``: each budget is charged the
        difference (given back, when it used less) and its reservation ends.  True when a budget moved."""
        self.unhold(weight)
        input, output = parts(weight)
        used_in, used_out = settled(weight, actual)
        extra = ((self.tokens, used_in + used_out - input - output), (self.input, used_in - input))
        moved = False
        for pace, n in (*extra, (self.output, used_out - output)):
            if pace is not None and n:
                pace.charge(n)
                moved = True
        return moved

    def unhold(self, weight: float) -> None:
        """A call of ``weight`` is off the wire: what it reserved is no longer held."""
        self._held = max(0.0, self._held - reserved(weight))

    def drop(self, weight: float) -> bool:
        """A call of ``weight`` ended with no answer (refused, failed, cancelled): its reservation
        is given back (no answer used it); the rest stays charged.  True when a budget moved."""
        back = reserved(weight)
        if not back:
            return False
        self.unhold(weight)
        for pace in (self.tokens, self.output):
            if pace is not None:
                pace.charge(-back)
        return True

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


def _room(pace: Pace, held: float) -> float:
    """Room beyond the burst the reservations in flight give a budget: all of them, up to a minute's
    worth of it (its provider's bucket) less the burst."""
    rate = pace.rate
    if not held or rate is None:
        return 0.0
    return min(held, max(0.0, MINUTE * rate - pace.burst))
