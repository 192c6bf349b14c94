"""The token budgets of one account, each paced apart (:class:`Budgets`), charged what a call
weighs (a :class:`~playbook.providers.limits.weights.Tokens`: input and output apart).

Providers count tokens in different budgets: OpenAI and Azure one budget of input and output
together (``tpm``), Anthropic input and output tokens apart (``itpm``, ``otpm``).  A call is
charged its estimate in each budget the account has when it goes, and the difference when its
answer says what it used.  Output a provider reserves when a request starts (Anthropic's
``max_tokens``) is held while the call is in flight and given back when it is answered; output a
provider counts on arrival whatever the answer uses (Azure's ``max_tokens``) stays charged.

A budget whose provider says on every answer what its bucket holds (Anthropic's
``anthropic-ratelimit-input-tokens-remaining`` and ``-output-tokens-remaining``) is kept as that
bucket once it has said so (:meth:`Budgets.fill`): it holds a minute's worth, as Anthropic
documents, and its level is what the provider said less what was sent since.  A call then goes
as soon as the bucket holds its tokens, and what the bucket refilled while nothing was sent (a
hold, an overload's backoff) is used when sending starts again, as the provider lets it be.

Like :class:`~playbook.providers.limits.pace.Pace` it reads no clock: each method takes ``now``.
"""

from __future__ import annotations

import math
from collections import deque

from playbook.providers.limits.pace import Pace
from playbook.providers.limits.weights import Rates, parts, reserved, settled

__all__ = ["MINUTE", "Budgets", "token_burst"]


def token_burst(rate: float) -> int:
    """Tokens are paced evenly, with at most half a second's worth at once: providers enforce a
    per-minute token limit over much shorter periods (a minute's worth sent at once is refused),
    and calls that leave evenly may still arrive together, or use more tokens than estimated."""
    return max(1, int(rate / 2))


MINUTE = 60.0  # seconds of a budget its provider's bucket holds (Anthropic's: the limit per minute)
# Seconds before an answer is read within which a call sent may not have reached its provider when
# the answer's word on the buckets was written: counted as not in it (sent after it), so taken from
# the level it says.  Counted twice at worst, that is a moment's tokens held back, never over-sent.
LAG = 0.5


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

    A budget :meth:`fill` has been told the level of is the provider's bucket instead: it holds a
    minute's worth, the reservations in flight count in it as they do in the provider's, and its
    level follows each answer's word.
    """

    __slots__ = ("tokens", "input", "output", "_held", "_buckets", "_sent", "_seen")

    def __init__(self, rates: Rates) -> None:
        self.tokens, self.input, self.output = (_pace(rate) for rate in rates)
        self._held = 0.0  # output the calls in flight reserved
        self._buckets: set[str] = set()  # the budgets kept as the provider's bucket (see fill)
        self._sent: deque[tuple[float, float, float]] = deque()  # (when, input, output) of the last LAG s
        self._seen = -math.inf  # calls sent by then are in the provider's last word on its buckets

    def __repr__(self) -> str:
        shown = [f"{name}={rate:.4g}/s" for name, rate in zip(Rates._fields, self.rates) if rate is not None]
        return f"<Budgets {' '.join(shown)}>"

    @property
    def rates(self) -> Rates:
        return Rates(
            *(pace.rate if pace is not None else None for pace in (self.tokens, self.input, self.output))
        )

    def _charged(self, weight: float) -> list[tuple[Pace, float, float]]:
        """Each budget with what ``weight`` counts in it and the room reservations in flight give it
        (none in a provider's bucket: they are in its level)."""
        input, output = parts(weight)
        held = self._held + reserved(weight)  # its own reservation too: only the answers' use waits
        output_held = 0.0 if "output" in self._buckets else held
        units = (
            (self.tokens, input + output, held),
            (self.input, input, 0.0),
            (self.output, output, output_held),
        )
        return [(pace, n, _room(pace, room)) for pace, n, room in units if pace is not None]

    def delay(self, now: float, weight: float) -> float:
        """Seconds until every budget has room for a call of ``weight``."""
        return max((pace.delay(now, n, room) for pace, n, room in self._charged(weight)), default=0.0)

    def take(self, now: float, weight: float, *, queued: bool = False) -> None:
        """Charge a call of ``weight`` sent at ``now`` to each budget."""
        held = self._held
        for pace, n, room in self._charged(weight):
            kept = pace is not self.input and not (pace is self.output and "output" in self._buckets)
            pace.take(now, queued=queued, weight=n, room=room, held=held if kept else 0.0)
        self._held += reserved(weight)
        self._sent.append((now, *parts(weight)))
        self._since(now)

    def _since(self, now: float) -> tuple[float, float]:
        """Input and output tokens of the calls sent over the last ``LAG`` seconds."""
        sent = self._sent
        while sent and sent[0][0] <= now - LAG:
            sent.popleft()
        return sum(n for _, n, _ in sent), sum(n for _, _, n in sent)

    def fill(self, now: float, left: Rates) -> bool:
        """An answer read at ``now`` said what the provider's buckets held (``left``: input and
        output tokens): each such budget is kept as its bucket from now on (a minute's worth of
        it), at that level less what calls sent since took.  True when a budget moved."""
        since = self._since(now)
        moved = False
        for name, level, taken in (("input", left.input, since[0]), ("output", left.output, since[1])):
            pace: Pace | None = getattr(self, name)
            if level is None or pace is None or pace.rate is None:
                continue
            if name not in self._buckets:
                self._buckets.add(name)
                pace.burst = _capacity(pace.rate)
            pace.fill(now, level - taken)
            moved = True
        if moved:
            self._seen = now - LAG
        return moved

    def charge(self, weight: float, actual: float, sent_at: float = math.inf) -> bool:
        """A call charged ``weight`` and sent at ``sent_at`` was answered, using ``actual``: each
        budget is charged the difference (given back, when it used less) and its reservation ends.
        The provider's input bucket counted a call's input when it arrived: when its level was
        told after that, the difference is in it already.  True when a budget moved."""
        self.unhold(weight)
        input, output = parts(weight)
        used_in, used_out = settled(weight, actual)
        counted = "input" in self._buckets and sent_at <= self._seen
        extra = (
            (self.tokens, used_in + used_out - input - output),
            (self.input, 0.0 if counted else used_in - input),
        )
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
                pace.burst = _capacity(rate) if name in self._buckets else token_burst(rate)
                changed = True
        return changed


def _capacity(rate: float) -> int:
    """What a provider's bucket of ``rate`` tokens a second holds: a minute's worth (Anthropic's)."""
    return max(1, int(MINUTE * rate))


def _room(pace: Pace, held: float) -> float:
    """Room beyond the burst the reservations in flight give a budget: all of them, up to a minute's
    worth of it (its provider's bucket) less the burst."""
    rate = pace.rate
    if not held or rate is None:
        return 0.0
    return min(held, max(0.0, MINUTE * rate - pace.burst))
