"""Check 4, fairness: weighted fair sharing of one pool among its tenants.

Each tenant has a virtual service counter: tokens served divided by its contract
weight, inflated by how far beyond its quota it is sending (pressure), so heavy
senders lose priority adaptively. The queue serves the tenant with the least
virtual service first (ties by deadline). A tenant that was idle starts at the
pool's virtual time, so idleness does not bank credit (start-time fair queueing).

For tightening, it also keeps each tenant's recent share of service (decayed)
and the weights of the tenants currently active, so "above its fair share" is O(1).
"""

from __future__ import annotations

import math


class FairShare:
    """Weighted service accounting for one pool."""

    __slots__ = (
        "_decay",
        "active",
        "active_weight",
        "recent",
        "recent_total",
        "recent_updated",
        "served_tokens",
        "service",
        "virtual_time",
        "weights",
    )

    def __init__(self, *, weights: dict[str, float], share_half_life_s: float = 30.0) -> None:
        self.weights = weights
        self.service: dict[str, float] = {}  # weighted, pressure-inflated service
        self.served_tokens: dict[str, float] = {}  # raw tokens dispatched
        self.virtual_time = 0.0
        self.active: dict[str, int] = {}  # requests queued or running, per tenant
        self.active_weight = 0.0
        self._decay = math.log(2.0) / share_half_life_s
        self.recent: dict[str, float] = {}  # tenant -> decayed tokens, scaled (see charge)
        self.recent_total = 0.0
        self.recent_updated = 0.0  # the scale's epoch

    def key(self, tenant: str) -> float:
        return self.service.get(tenant, 0.0)

    def join(self, tenant: str) -> None:
        """A request of `tenant` entered the pool (queued or dispatched)."""
        n = self.active.get(tenant, 0)
        if n == 0:
            self.active_weight += self.weights.get(tenant, 1.0)
            if self.service.get(tenant, 0.0) < self.virtual_time:
                self.service[tenant] = self.virtual_time
        self.active[tenant] = n + 1

    def leave(self, tenant: str) -> None:
        """A request of `tenant` left the pool (finished, timed out, refused)."""
        n = self.active.get(tenant, 0) - 1
        if n <= 0:
            self.active.pop(tenant, None)
            self.active_weight -= self.weights.get(tenant, 1.0)
            if self.active_weight < 1e-9:
                self.active_weight = 0.0
        else:
            self.active[tenant] = n

    def charge(self, tenant: str, tokens: float, pressure: float, now: float) -> None:
        """Count a dispatch of `tokens` for `tenant`."""
        s = self.service.get(tenant, 0.0)
        if s > self.virtual_time:
            self.virtual_time = s
        w = self.weights.get(tenant, 1.0)
        self.service[tenant] = s + tokens / w * (pressure if pressure > 1.0 else 1.0)
        self.served_tokens[tenant] = self.served_tokens.get(tenant, 0.0) + tokens
        # Recent service, decayed: stored scaled by exp(decay x (now - epoch)), so a share
        # (mine / total) needs no decay at read time. Rebase before the scale overflows.
        x = self._decay * (now - self.recent_updated)
        if x > 50.0:
            shrink = math.exp(-x)
            self.recent = {t: v * shrink for t, v in self.recent.items()}
            self.recent_total *= shrink
            self.recent_updated = now
            x = 0.0
        scaled = tokens * math.exp(x)
        self.recent[tenant] = self.recent.get(tenant, 0.0) + scaled
        self.recent_total += scaled

    def under_share(self, tenant: str, tolerance: float) -> bool:
        """Is `tenant` taking no more than its fair share while others are active? (Alone
        in the pool, nobody is owed anything by it: its quota alone decides.)"""
        active = self.active
        n = len(active)
        if n == 0 or (n == 1 and tenant in active):
            return False
        return not self.over_share(tenant, tolerance)

    def over_share(self, tenant: str, tolerance: float) -> bool:
        """Is `tenant` taking more than (1 + tolerance) x its weighted share of recent service?"""
        if self.active_weight <= 0.0 or self.recent_total <= 0.0:
            return False
        w = self.weights.get(tenant, 1.0)
        fair = w / (self.active_weight if self.active_weight > w else w)
        return self.recent.get(tenant, 0.0) > self.recent_total * fair * (1.0 + tolerance)
