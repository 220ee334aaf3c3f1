"""Fixed-interval time series in bounded memory, for the report's plots and fairness.

Slot i covers [i x interval, (i + 1) x interval). Gauges are sampled once per slot
(queue depth, utilization, hysteresis state); counters accumulate events into
the slot of their time. When a run outgrows `max_points` slots, adjacent slots merge
(counters add, gauges average) and the interval doubles, so a day-long trace and
a ten-minute scenario cost the same memory.
"""

from __future__ import annotations

from typing import Any


class TimeSeries:
    """Named gauges and counters on one shared time grid."""

    __slots__ = ("counters", "gauges", "interval", "max_points", "n")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # results come back from worker processes (-j N); the compiled build's default
        # pickling would call TimeSeries() with no interval
        return _restore, (self.interval, self.max_points, self.n, self.gauges, self.counters)

    def __init__(self, *, interval: float, max_points: int = 2048) -> None:
        if interval <= 0 or max_points < 4:
            raise ValueError("interval must be positive and max_points >= 4")
        self.interval = interval
        self.max_points = max_points - max_points % 2
        self.n = 0  # slots in use
        self.gauges: dict[str, list[float]] = {}
        self.counters: dict[str, list[float]] = {}

    def slot(self, t: float) -> int:
        """Slot of time t, growing (and merging) the grid to hold it."""
        i = int(t / self.interval) if t > 0 else 0
        while i >= self.max_points:
            self._halve()
            i = int(t / self.interval)
        if i >= self.n:
            self._grow(i + 1)
        return i

    def add(self, name: str, t: float, value: float) -> None:
        i = self.slot(t)
        arr = self.counters.get(name)
        if arr is None:
            arr = self.counters[name] = [0.0] * self.n
        arr[i] += value

    def set(self, name: str, t: float, value: float) -> None:
        """A gauge reading for the slot of time t (the last reading in a slot wins)."""
        i = self.slot(t)
        arr = self.gauges.get(name)
        if arr is None:
            arr = self.gauges[name] = [float("nan")] * self.n
        arr[i] = value

    def _grow(self, n: int) -> None:
        if n <= self.n:
            return
        pad = n - self.n
        for arr in self.counters.values():
            arr.extend([0.0] * pad)
        for arr in self.gauges.values():
            arr.extend([float("nan")] * pad)
        self.n = n

    def _halve(self) -> None:
        self._grow(self.n + self.n % 2)
        for name, arr in self.counters.items():
            self.counters[name] = [arr[i] + arr[i + 1] for i in range(0, self.n, 2)]
        for name, arr in self.gauges.items():
            self.gauges[name] = [_mean2(arr[i], arr[i + 1]) for i in range(0, self.n, 2)]
        self.n //= 2
        self.interval *= 2.0

    def times(self) -> list[float]:
        """Start of each slot."""
        return [i * self.interval for i in range(self.n)]

    def counter(self, name: str) -> list[float]:
        arr = self.counters.get(name)
        return list(arr) if arr is not None else [0.0] * self.n

    def gauge(self, name: str) -> list[float]:
        arr = self.gauges.get(name)
        return list(arr) if arr is not None else [float("nan")] * self.n

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval, "t": self.times(),
            "gauges": {k: [None if x != x else x for x in v] for k, v in self.gauges.items()},
            "counters": {k: list(v) for k, v in self.counters.items()},
        }


def _mean2(a: float, b: float) -> float:
    if a != a:  # NaN: no reading
        return b
    if b != b:
        return a
    return (a + b) / 2.0


def _restore(
    interval: float, max_points: int, n: int, gauges: dict[str, list[float]],
    counters: dict[str, list[float]],
) -> TimeSeries:
    ts = TimeSeries(interval=interval, max_points=max_points)
    ts.n, ts.gauges, ts.counters = n, gauges, counters
    return ts
