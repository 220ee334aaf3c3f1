"""Utilization hysteresis: admission tightens first (fast), an autoscale signal
follows if utilization persists (slow), and both relax only after sustained
drops, the autoscale signal only once new capacity has arrived (or the load has
stayed low for twice the relax window). No state flips twice within `hold_s`.

Readings are smoothed first (an exponential moving average with time constant
`smooth_s`): one large request reserving a GPU's KV for a moment is not saturation,
and tightening on it refused over-quota work a busy but unsaturated pool could serve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HysteresisSettings:
    low: float  # relax below this
    high: float  # tighten above this
    autoscale_margin: float  # autoscale above high + margin ...
    autoscale_after_s: float  # ... held this long
    relax_after_s: float  # below low this long before relaxing
    hold_s: float  # minimum time between two flips
    smooth_s: float = 0.0  # time constant of the readings' moving average (0: raw)


class HysteresisMonitor:
    """Two-threshold controller of one pool."""

    __slots__ = (
        "_above_since",
        "_below_since",
        "_gpus_at_signal",
        "_hot_since",
        "_read_at",
        "autoscale",
        "enabled",
        "flips",
        "last_flip",
        "settings",
        "tightened",
        "utilization",
    )

    def __init__(self, settings: HysteresisSettings, *, enabled: bool = True) -> None:
        self.settings = settings
        self.enabled = enabled
        self.tightened = False
        self.autoscale = False
        self.utilization = 0.0
        self.last_flip = float("-inf")
        self.flips: list[tuple[float, str]] = []  # (time, what) for tests and metrics
        self._above_since: float | None = None
        self._hot_since: float | None = None
        self._below_since: float | None = None
        self._gpus_at_signal = 0
        self._read_at = float("-inf")  # time of the last reading (for the average)

    @property
    def saturated(self) -> bool:
        """Is the (smoothed) reading at or above the low threshold now? Unlike
        `tightened`, this does not wait out the relax window: it gates work that only
        idle capacity may take (over-quota requests), which must leave the pool
        below the point where tightening starts."""
        return self.utilization >= self.settings.low

    def update(self, utilization: float, gpus: int, now: float) -> str | None:
        """Feed a reading; returns what flipped ('tighten', 'autoscale', 'autoscale_off',
        'relax') or None. At most one flip per call and per hold period."""
        if not self.enabled:
            return None
        s = self.settings
        dt = now - self._read_at
        self._read_at = now
        if s.smooth_s > 0.0 and dt < 1e9:
            if dt > 0.0:
                a = 1.0 - math.exp(-dt / s.smooth_s)
                utilization = self.utilization + a * (utilization - self.utilization)
            else:
                utilization = self.utilization
        self.utilization = utilization
        self._above_since = _since(self._above_since, utilization > s.high, now)
        self._hot_since = _since(self._hot_since, utilization > s.high + s.autoscale_margin, now)
        self._below_since = _since(self._below_since, utilization < s.low, now)
        if now - self.last_flip < s.hold_s:
            return None
        flip: str | None = None
        if not self.tightened and self._above_since is not None:
            self.tightened, flip = True, "tighten"
        elif (
            self.tightened and not self.autoscale and self._hot_since is not None
            and now - self._hot_since >= s.autoscale_after_s
        ):
            self.autoscale, flip = True, "autoscale"
            self._gpus_at_signal = gpus
        elif self._below_since is not None and now - self._below_since >= s.relax_after_s:
            low_for = now - self._below_since
            if self.autoscale:
                if gpus > self._gpus_at_signal or low_for >= 2.0 * s.relax_after_s:
                    self.autoscale, flip = False, "autoscale_off"
                    self._below_since = now  # relax admission only after another quiet window
            elif self.tightened:
                self.tightened, flip = False, "relax"
        if flip is not None:
            self.last_flip = now
            self.flips.append((now, flip))
            if len(self.flips) > 1000:
                del self.flips[:500]
        return flip


def _since(start: float | None, holds: bool, now: float) -> float | None:
    """When a condition started holding (kept while it holds, None once it stops)."""
    if not holds:
        return None
    return now if start is None else start
