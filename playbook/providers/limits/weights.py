"""What a call weighs in tokens (:class:`Tokens`: input and output apart, and how the provider
counts the output), and the tokens a second an account's budgets let through (:class:`Rates`)."""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = ["Charge", "Rates", "Tokens", "counted", "parts", "reserved", "settled"]

# How a provider counts the output a call is charged when it goes:
#   "estimate": what answers usually take; the answer's real count when it comes (OpenAI)
#   "reserved": the request's max_tokens, held while it is in flight, then the real count (Anthropic)
#   "counted":  the request's max_tokens, whatever the answer uses (Azure counts it on arrival)
# A reserved call's ``usual``: the output its answer is expected to use, the rest being held only.
Charge = Literal["estimate", "reserved", "counted"]


class Tokens(float):
    """A call's tokens, input and output apart: ``Tokens(input, output)``, how its provider counts
    the output (``charge``, see :data:`Charge`) and, for output reserved, what the answer is
    expected to use of it (``usual``).  As a number it is input and output together, so whatever
    adds, compares or prints a call's weight keeps working."""

    __slots__ = ("input", "output", "charge", "usual")

    input: float
    output: float
    charge: Charge
    usual: float

    def __new__(
        cls, input: float, output: float = 0.0, charge: Charge = "estimate", usual: float = 0.0
    ) -> Tokens:
        self = super().__new__(cls, input + output)
        self.input, self.output, self.charge = float(input), float(output), charge
        self.usual = min(float(usual), self.output)
        return self

    def __reduce__(self) -> tuple[type[Tokens], tuple[float, float, Charge, float]]:
        return (Tokens, (self.input, self.output, self.charge, self.usual))

    def __repr__(self) -> str:
        charge = f", charge={self.charge!r}" if self.charge != "estimate" else ""
        usual = f", usual={self.usual:g}" if self.charge == "reserved" else ""
        return f"Tokens(input={self.input:g}, output={self.output:g}{charge}{usual})"


def parts(weight: float) -> tuple[float, float]:
    """``(input, output)`` of a call's weight: a plain number says no more than its total, which
    counts as input."""
    if isinstance(weight, Tokens):
        return weight.input, weight.output
    return float(weight), 0.0


def reserved(weight: float) -> float:
    """The output tokens a call of ``weight`` holds while it is in flight beyond what its answer is
    expected to use, to be given back (0 unless its provider reserves max_tokens)."""
    return weight.output - weight.usual if isinstance(weight, Tokens) and weight.charge == "reserved" else 0.0


def settled(weight: float, actual: float) -> tuple[float, float]:
    """``(input, output)`` a call charged ``weight`` counts once its answer says it used ``actual``:
    the real count, but the output its provider counts whatever the answer uses."""
    used_in, used_out = parts(actual)
    if isinstance(weight, Tokens) and weight.charge == "counted":
        used_out = weight.output
    return used_in, used_out


def counted(weight: float, actual: float) -> Tokens:
    """What a call charged ``weight`` that used ``actual`` counts in its provider's budgets."""
    return Tokens(*settled(weight, actual))


class Rates(NamedTuple):
    """Tokens a second an account lets through: all tokens, input tokens, output tokens (None: no
    such budget)."""

    tokens: float | None = None
    input: float | None = None
    output: float | None = None
