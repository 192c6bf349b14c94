"""Limits on calls to a provider: the :class:`Limiter` protocol a governor acts over, the limiter
whose state lives in this process (:class:`LocalLimiter`) and the one shared through Redis by
every process and machine on one account (:mod:`playbook.providers.limits.shared`, imported when used, so
playbook imports without redis installed), plus the exact primitives they are made of: pacing and
rate adaptation (:class:`Pace`), calls in flight (:class:`Window`), health (:class:`Health`, which
judges distinct calls and learns what became of those that failed: :class:`Standing`), backoff
(:class:`Backoff`) and reading "come back later" headers (:func:`retry_after`).
"""

from __future__ import annotations

from playbook.providers.limits.backoff import Backoff, announced, body_retry_delay, duration, retry_after
from playbook.providers.limits.base import HEADROOM, LONE, Limiter, Permit, Verdict
from playbook.providers.limits.gates import Window
from playbook.providers.limits.health import Health, Standing
from playbook.providers.limits.local import LocalLimiter
from playbook.providers.limits.pace import Pace

__all__ = [
    "HEADROOM",
    "LONE",
    "Backoff",
    "Health",
    "Limiter",
    "LocalLimiter",
    "Pace",
    "Permit",
    "Standing",
    "Verdict",
    "Window",
    "announced",
    "body_retry_delay",
    "duration",
    "retry_after",
]
