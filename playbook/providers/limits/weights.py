"""What a call weighs in tokens (:class:`Tokens`: input and output apart), and the tokens a
second an account's budgets let through (:class:`Rates`)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Rates", "Tokens", "parts"]


class Tokens(float):
    """A call's tokens, input and output apart: ``Tokens(input, output)``.  As a number it is their
    total, so whatever adds, compares or prints a call's weight keeps working."""

    __slots__ = ("input", "output")

    input: float
    output: float

    def __new__(cls, input: float, output: float = 0.0) -> Tokens:
        self = super().__new__(cls, input + output)
        self.input, self.output = float(input), float(output)
        return self

    def __reduce__(self) -> tuple[type[Tokens], tuple[float, float]]:
        return (Tokens, (self.input, self.output))

    def __repr__(self) -> str:
        return f"Tokens(input={self.input:g}, output={self.output:g})"


def parts(weight: float) -> tuple[float, float]:
    """``(input, output)`` of a call's weight: a plain number says no more than its total, which
    counts as input."""
    if isinstance(weight, Tokens):
        return weight.input, weight.output
    return float(weight), 0.0


class Rates(NamedTuple):
    """Tokens a second an account lets through: all tokens, input tokens, output tokens (None: no
    such budget)."""

    tokens: float | None = None
    input: float | None = None
    output: float | None = None
