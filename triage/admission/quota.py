"""Check 1, tenant quota: a token bucket with borrowing, plus request-rate and
concurrency limits beside it.

The bucket is one number, `level`, in [-max_debt, burst]: positive is tokens in
hand, negative is debt. Refill adds rate x elapsed, so debt is repaid before the
bucket holds tokens again, and a request of `cost` is admissible when
level >= cost - max_debt (borrowing) or level >= cost (no borrowing). That makes
the retry hint exact: (cost - floor - level) / rate seconds.
"""

from __future__ import annotations

import math
from typing import Final

EPSILON: Final = 1e-9  # relative slack, so a client returning exactly at the hint is admitted


class TokenBucket:
    """A token bucket that may borrow against future refill up to a debt ceiling."""

    __slots__ = ("burst", "level", "max_debt", "rate", "updated")

    def __init__(
        self, *, rate: float, burst: float, max_debt: float = 0.0,
        level: float | None = None, updated: float = 0.0,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.max_debt = max_debt
        self.level = burst if level is None else level
        self.updated = updated

    def refill(self, now: float) -> None:
        """Bring the bucket to `now`; a clock that steps back changes nothing."""
        dt = now - self.updated
        if dt > 0.0:
            level = self.level + dt * self.rate
            self.level = level if level < self.burst else self.burst
            self.updated = now

    def floor(self, borrowing: bool) -> float:
        return -self.max_debt if borrowing else 0.0

    def admits(self, cost: float, borrowing: bool) -> bool:
        """Check without consuming (call refill first)."""
        return self.level - cost >= (-self.max_debt if borrowing else 0.0) - EPSILON * (1.0 + cost)

    def take(self, cost: float) -> None:
        self.level -= cost

    def wait_s(self, cost: float, borrowing: bool) -> float | None:
        """Exact seconds until `admits(cost)` holds; None when it never can."""
        floor = -self.max_debt if borrowing else 0.0
        if cost + floor > self.burst:
            return None
        need = cost + floor - self.level
        return need / self.rate if need > 0.0 else 0.0

    @property
    def tokens(self) -> float:
        return self.level if self.level > 0.0 else 0.0

    @property
    def debt(self) -> float:
        return -self.level if self.level < 0.0 else 0.0

    def snapshot(self) -> dict[str, float]:
        return {"level": self.level, "updated": self.updated}

    def restore(self, state: dict[str, float]) -> None:
        self.level = min(self.burst, max(-self.max_debt, float(state["level"])))
        self.updated = float(state["updated"])


class OfferedLoad:
    """Exponentially decayed rate of tokens a tenant offers, to spot tenants sending far
    beyond their quota (they lose priority in proportion)."""

    __slots__ = ("decay_per_s", "updated", "value")

    def __init__(self, *, half_life_s: float = 10.0) -> None:
        self.decay_per_s = math.log(2.0) / half_life_s
        self.value = 0.0  # decayed sum of offered tokens
        self.updated = 0.0

    def add(self, cost: float, now: float) -> float:
        """Record `cost` offered at `now`; returns the offered rate in tokens per second."""
        dt = now - self.updated
        if dt > 0.0:
            self.value *= math.exp(-self.decay_per_s * dt)
            self.updated = now
        self.value += cost
        return self.value * self.decay_per_s

    def rate(self) -> float:
        """Offered tokens per second (the decayed sum's steady-state equivalent)."""
        return self.value * self.decay_per_s
