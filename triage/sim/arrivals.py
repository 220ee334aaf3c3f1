"""Arrival processes: when requests come, on a clock starting at 0 (seconds).

Poisson for independent users, steady for a metronome-like producer (embeddings
pipelines), on/off for bursty interactive traffic (RAG), a daily curve with a
spike at a given hour (the 9 AM batch), and a piecewise-constant profile for
anything else. Every process yields times lazily, so a day of traffic costs no
memory, and `scaled(k, rate)` stretches its time axis (periods, day length) by k and
multiplies its rates by `rate`: k is how `--scale` shortens a run without changing
load, `rate` is how `--load` sets the offered load (triage/sim/capacity.py).

Processes are frozen dataclasses; each pickles by its fields (`__reduce__`), since
the compiled build's default pickling assigns fields one by one after construction,
which a frozen class refuses (and `-j N` sends scenarios to worker processes).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from triage.sim.dists import expovariate
from triage.sim.errors import ScenarioError


class ArrivalProcess(Protocol):
    def times(self, rng: random.Random, end: float) -> Iterator[float]: ...

    def mean_rate(self, end: float) -> float: ...

    def scaled(self, k: float, rate: float = 1.0) -> ArrivalProcess: ...


def rebuild(cls: Any, kwargs: dict[str, Any]) -> Any:
    """cls(**kwargs): the unpickler of the frozen records of the simulator."""
    return cls(**kwargs)


def reduce_fields(obj: Any) -> tuple[Any, tuple[Any, ...]]:
    """A frozen dataclass as (rebuild, (class, fields)) for pickle."""
    return rebuild, (type(obj), {f.name: getattr(obj, f.name) for f in fields(obj)})


@dataclass(frozen=True, slots=True)
class Poisson:
    rate: float  # requests per second

    def times(self, rng: random.Random, end: float) -> Iterator[float]:
        if self.rate <= 0:
            return
        t = expovariate(rng, self.rate)
        while t < end:
            yield t
            t += expovariate(rng, self.rate)

    def mean_rate(self, end: float) -> float:
        return self.rate

    def scaled(self, k: float, rate: float = 1.0) -> Poisson:
        return self if rate == 1.0 else Poisson(self.rate * rate)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_fields(self)


@dataclass(frozen=True, slots=True)
class Steady:
    rate: float  # requests per second, evenly spaced
    jitter: float = 0.0  # each arrival moves by up to +-jitter x spacing

    def times(self, rng: random.Random, end: float) -> Iterator[float]:
        if self.rate <= 0:
            return
        gap = 1.0 / self.rate
        i = 0
        while True:
            t = (i + 0.5) * gap
            if self.jitter:
                t += (rng.random() * 2.0 - 1.0) * self.jitter * gap
            if t >= end:
                return
            yield max(0.0, t)
            i += 1

    def mean_rate(self, end: float) -> float:
        return self.rate

    def scaled(self, k: float, rate: float = 1.0) -> Steady:
        return self if rate == 1.0 else replace(self, rate=self.rate * rate)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_fields(self)


@dataclass(frozen=True, slots=True)
class OnOff:
    """Alternating bursts: `on_rate` for ~on_s seconds, `off_rate` for ~off_s seconds."""

    on_rate: float
    on_s: float
    off_s: float
    off_rate: float = 0.0
    random_periods: bool = True  # exponential period lengths (mean on_s/off_s) or fixed
    start_on: bool = False

    def _periods(self, rng: random.Random) -> Iterator[tuple[float, float]]:
        on = self.start_on
        while True:
            mean = self.on_s if on else self.off_s
            d = expovariate(rng, 1.0 / mean) if self.random_periods and mean > 0 else mean
            yield d, self.on_rate if on else self.off_rate
            on = not on

    def times(self, rng: random.Random, end: float) -> Iterator[float]:
        seg_rng = random.Random(rng.getrandbits(64))  # periods don't shift with arrivals drawn
        start = 0.0
        for dur, rate in self._periods(seg_rng):
            stop = min(start + dur, end)
            if rate > 0:
                t = start + expovariate(rng, rate)
                while t < stop:
                    yield t
                    t += expovariate(rng, rate)
            start += dur
            if start >= end:
                return

    def mean_rate(self, end: float) -> float:
        total = self.on_s + self.off_s
        return (self.on_rate * self.on_s + self.off_rate * self.off_s) / total if total else 0.0

    def scaled(self, k: float, rate: float = 1.0) -> OnOff:
        return replace(
            self, on_s=self.on_s * k, off_s=self.off_s * k, on_rate=self.on_rate * rate,
            off_rate=self.off_rate * rate,
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_fields(self)


@dataclass(frozen=True, slots=True)
class Daily:
    """A diurnal curve between trough and peak (cosine, highest at peak_hour), plus a
    spike of `spike_rate` extra requests/s during [spike_hour, spike_hour + spike_h)."""

    trough_rate: float
    peak_rate: float
    peak_hour: float = 14.0
    spike_rate: float = 0.0
    spike_hour: float = 9.0
    spike_h: float = 0.25
    start_hour: float = 0.0
    day_s: float = 86_400.0  # simulated seconds per 24 hours (compress the day)

    def hour(self, t: float) -> float:
        return (self.start_hour + 24.0 * t / self.day_s) % 24.0

    def rate(self, t: float) -> float:
        h = self.hour(t)
        phase = 2.0 * math.pi * (h - self.peak_hour) / 24.0
        r = self.trough_rate + (self.peak_rate - self.trough_rate) * 0.5 * (1.0 + math.cos(phase))
        if self.spike_rate and (h - self.spike_hour) % 24.0 < self.spike_h:
            r += self.spike_rate
        return r

    def times(self, rng: random.Random, end: float) -> Iterator[float]:
        top = max(self.peak_rate, self.trough_rate) + self.spike_rate
        if top <= 0:
            return
        t = 0.0
        rate = self.rate
        while True:  # thinning: candidates at the top rate, kept with rate(t) / top
            t += expovariate(rng, top)
            if t >= end:
                return
            if rng.random() * top < rate(t):
                yield t

    def mean_rate(self, end: float) -> float:
        n = 256
        return sum(self.rate((i + 0.5) * end / n) for i in range(n)) / n if end > 0 else 0.0

    def scaled(self, k: float, rate: float = 1.0) -> Daily:
        return replace(
            self, day_s=self.day_s * k, trough_rate=self.trough_rate * rate,
            peak_rate=self.peak_rate * rate, spike_rate=self.spike_rate * rate,
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_fields(self)


@dataclass(frozen=True, slots=True)
class Profile:
    """Piecewise-constant Poisson rate: [(from_s, rate), ...], optionally repeating."""

    points: tuple[tuple[float, float], ...]
    repeat_s: float | None = None

    def rate(self, t: float) -> float:
        if self.repeat_s:
            t %= self.repeat_s
        r = 0.0
        for start, rate in self.points:
            if t >= start:
                r = rate
        return r

    def _segments(self, end: float) -> Iterator[tuple[float, float, float]]:
        offset = 0.0
        while offset < end:
            pts = self.points
            for i, (start, rate) in enumerate(pts):
                stop = pts[i + 1][0] if i + 1 < len(pts) else (self.repeat_s or math.inf)
                yield offset + start, min(offset + stop, end), rate
            if not self.repeat_s:
                return
            offset += self.repeat_s

    def times(self, rng: random.Random, end: float) -> Iterator[float]:
        for a, b, rate in self._segments(end):
            if rate <= 0 or a >= b:
                continue
            t = a + expovariate(rng, rate)
            while t < b:
                yield t
                t += expovariate(rng, rate)

    def mean_rate(self, end: float) -> float:
        total = sum((b - a) * r for a, b, r in self._segments(end) if b > a)
        return total / end if end > 0 else 0.0

    def scaled(self, k: float, rate: float = 1.0) -> Profile:
        return Profile(
            points=tuple((s * k, r * rate) for s, r in self.points),
            repeat_s=self.repeat_s * k if self.repeat_s else None,
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_fields(self)


_KINDS: dict[str, type] = {
    "poisson": Poisson, "steady": Steady, "onoff": OnOff, "daily": Daily, "profile": Profile,
}


_RATES = ("rate", "on_rate", "off_rate", "trough_rate", "peak_rate", "spike_rate")
_POSITIVE = ("day_s", "repeat_s")  # when given: > 0
_NON_NEGATIVE = ("on_s", "off_s", "spike_h", "jitter")
_FLAGS = ("random_periods", "start_on")


def _check(proc: Any, where: str) -> None:
    """One line naming the field for every number that cannot be right."""
    for f in fields(proc):
        v = getattr(proc, f.name)
        if f.name == "points" or (v is None and f.name == "repeat_s"):
            continue
        if f.name in _FLAGS:
            if not isinstance(v, bool):
                raise ScenarioError(f"{where}.{f.name}: expected true or false, got {v!r}")
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ScenarioError(f"{where}.{f.name}: expected a number, got {v!r}")
        if f.name in _RATES and v < 0:
            raise ScenarioError(f"{where}.{f.name}: expected a rate >= 0, got {v!r}")
        if f.name in _POSITIVE and v <= 0:
            raise ScenarioError(f"{where}.{f.name}: must be positive, got {v!r}")
        if f.name in _NON_NEGATIVE and v < 0:
            raise ScenarioError(f"{where}.{f.name}: must be >= 0, got {v!r}")
    if isinstance(proc, OnOff) and proc.on_s + proc.off_s <= 0:
        raise ScenarioError(f"{where}: on_s + off_s must be positive")
    if isinstance(proc, Steady) and proc.jitter > 1.0:
        raise ScenarioError(f"{where}.jitter: must be within 0..1, got {proc.jitter!r}")


def parse_arrivals(spec: Any, where: str) -> ArrivalProcess:
    """From a scenario mapping: {process: poisson|steady|onoff|daily|profile, ...fields}."""
    if not isinstance(spec, dict) or "process" not in spec:
        raise ScenarioError(f"{where}: expected a mapping with 'process' ({', '.join(_KINDS)})")
    kw = {k: v for k, v in spec.items() if k != "process"}
    kind = _KINDS.get(str(spec["process"]))
    if kind is None:
        raise ScenarioError(f"{where}.process: unknown {spec['process']!r} ({', '.join(_KINDS)})")
    if kind is Profile:
        pts = kw.get("points")
        if not isinstance(pts, list) or not pts:
            raise ScenarioError(f"{where}.points: expected a list of [from_s, rate] pairs")
        try:
            kw["points"] = tuple(sorted((float(a), float(b)) for a, b in pts))
        except (TypeError, ValueError):
            raise ScenarioError(f"{where}.points: expected [from_s, rate] pairs") from None
        for a, b in kw["points"]:
            if a < 0 or b < 0 or not (math.isfinite(a) and math.isfinite(b)):
                raise ScenarioError(f"{where}.points: [{a}, {b}]: times and rates must be >= 0")
    for key, v in kw.items():
        if key in _FLAGS:
            if not isinstance(v, bool):
                raise ScenarioError(f"{where}.{key}: expected true or false, got {v!r}")
        elif key != "points" and not (v is None and key == "repeat_s") and (
            isinstance(v, bool) or not isinstance(v, int | float)
        ):
            raise ScenarioError(f"{where}.{key}: expected a number, got {v!r}")
    try:
        proc: ArrivalProcess = kind(**kw)
    except TypeError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    _check(proc, where)
    return proc
