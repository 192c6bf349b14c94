"""Limits on calls to a provider: the :class:`Limiter` protocol a governor acts over, the limiter
whose state lives in this process (:class:`LocalLimiter`) and the one shared through Redis by
every process and machine on one account (:mod:`playbook.providers.limits.shared`, imported when used, so
playbook imports without redis installed), plus the exact primitives they are made of: pacing and
rate adaptation (:class:`Pace`), what a call weighs in tokens (:class:`Tokens`, input and output
apart) and the token budgets it is charged to (:class:`Rates`), calls in flight (:class:`Window`), health (:class:`Health`, which
judges distinct calls and learns what became of those that failed: :class:`Standing`), backoff
(:class:`Backoff`), reading "come back later" headers (:func:`retry_after`) and the limits an
LLM provider announces (:func:`announced`).
"""

from __future__ import annotations

from playbook.providers.limits.backoff import (
    Announced,
    Backoff,
    announced,
    body_retry_delay,
    duration,
    retry_after,
)
from playbook.providers.limits.base import HEADROOM, LONE, Limiter, Permit, Verdict
from playbook.providers.limits.gates import Window
from playbook.providers.limits.health import Health, Standing
from playbook.providers.limits.local import LocalLimiter
from playbook.providers.limits.pace import Pace
from playbook.providers.limits.weights import Rates, Tokens

__all__ = [
    "HEADROOM",
    "LONE",
    "Announced",
    "Backoff",
    "Health",
    "Limiter",
    "LocalLimiter",
    "Pace",
    "Permit",
    "Rates",
    "Standing",
    "Tokens",
    "Verdict",
    "Window",
    "announced",
    "body_retry_delay",
    "duration",
    "retry_after",
]
