"""Token-count distributions for workloads: constant, uniform, lognormal, empirical.

Real prompt and output lengths are heavy-tailed (the Azure traces span 1 to 10^4
tokens), so lognormal with a median and a spread is the default shape, and an
empirical distribution can be read from a trace column (reservoir-sampled, so a
huge file costs a bounded sample, not its length).
"""

from __future__ import annotations

import csv
import math
import random
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any, Final, Protocol

from triage.sim.errors import ScenarioError

EMPIRICAL_SAMPLE = 10_000  # values kept from a file column (reservoir sample)

# random.Random's exponential and lognormal draws, restated so the compiled simulator
# runs them natively: the same arithmetic on the same rng.random() stream, so every
# draw is bit-identical to rng.expovariate / rng.lognormvariate (tests pin that).
_NV_MAGICCONST: Final = 4 * math.exp(-0.5) / math.sqrt(2.0)


def expovariate(rng: random.Random, rate: float) -> float:
    """rng.expovariate(rate)."""
    return -math.log(1.0 - rng.random()) / rate


def lognormvariate(rng: random.Random, mu: float, sigma: float) -> float:
    """rng.lognormvariate(mu, sigma) (Kinderman-Monahan, as random.normalvariate)."""
    while True:
        u1 = rng.random()
        u2 = 1.0 - rng.random()
        z = _NV_MAGICCONST * (u1 - 0.5) / u2
        zz = z * z / 4.0
        if zz <= -math.log(u2):
            break
    return math.exp(mu + z * sigma)


class TokenDist(Protocol):
    """Draws a positive token count."""

    def sample(self, rng: random.Random) -> int: ...

    def mean(self) -> float: ...


def _rebuild(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return cls(*args, **kwargs)


class Const:
    __slots__ = ("value",)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # the compiled build's default pickling calls the class with no arguments
        return _rebuild, (Const, (self.value,), {})

    def __init__(self, value: int) -> None:
        self.value = value

    def sample(self, rng: random.Random) -> int:
        return self.value

    def mean(self) -> float:
        return float(self.value)


class Uniform:
    __slots__ = ("hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild, (Uniform, (self.lo, self.hi), {})

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)

    def mean(self) -> float:
        return (self.lo + self.hi) / 2.0


class LogNormal:
    """exp(N(ln median, sigma)), rounded and clamped to [lo, hi]."""

    __slots__ = ("hi", "lo", "median", "mu", "sigma")

    def __init__(self, *, median: float, sigma: float, lo: int, hi: int) -> None:
        self.median = median
        self.mu = math.log(median)
        self.sigma = sigma
        self.lo, self.hi = lo, hi

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        kw = {"median": self.median, "sigma": self.sigma, "lo": self.lo, "hi": self.hi}
        return _rebuild, (LogNormal, (), kw)

    def sample(self, rng: random.Random) -> int:
        v = int(lognormvariate(rng, self.mu, self.sigma) + 0.5)
        return self.lo if v < self.lo else (self.hi if v > self.hi else v)

    def mean(self) -> float:
        """Unclamped mean (clamping to a generous range changes it little)."""
        return min(float(self.hi), math.exp(self.mu + self.sigma * self.sigma / 2.0))


class Empirical:
    """Draws from observed values, with optional weights."""

    __slots__ = ("_cum", "_total", "values", "weights")

    def __init__(self, values: list[int], weights: list[float] | None = None) -> None:
        if not values:
            raise ScenarioError("empirical distribution: no values")
        self.values = values
        self.weights = weights
        w = weights if weights is not None else [1.0] * len(values)
        if len(w) != len(values) or any(x < 0 for x in w) or sum(w) <= 0:
            raise ScenarioError("empirical distribution: weights must match values and be >= 0")
        self._cum = list(accumulate(w))
        self._total = self._cum[-1]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild, (Empirical, (self.values, self.weights), {})

    def sample(self, rng: random.Random) -> int:
        i = bisect_right(self._cum, rng.random() * self._total)
        return self.values[min(i, len(self.values) - 1)]

    def mean(self) -> float:
        prev = 0.0
        acc = 0.0
        for v, c in zip(self.values, self._cum, strict=True):
            acc += v * (c - prev)
            prev = c
        return acc / self._total


def _int(spec: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = spec.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ScenarioError(f"{where}.{key}: expected a non-negative number, got {v!r}")
    return int(v)


def _float(spec: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = spec.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ScenarioError(f"{where}.{key}: expected a non-negative number, got {v!r}")
    return float(v)


def column_sample(
    path: Path, column: str, *, seed: int = 0, k: int = EMPIRICAL_SAMPLE
) -> list[int]:
    """A reservoir sample of k integer values of one CSV column (streamed)."""
    rng = random.Random(seed)
    out: list[int] = []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or column not in reader.fieldnames:
                raise ScenarioError(f"{path}: no column {column!r} (has {reader.fieldnames})")
            for n, row in enumerate(reader):
                v = int(float(row[column]))
                if n < k:
                    out.append(v)
                else:
                    j = rng.randint(0, n)
                    if j < k:
                        out[j] = v
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ScenarioError(f"{path}: column {column!r} holds a non-number: {exc}") from None
    return out


def parse_dist(spec: Any, where: str, *, base: Path | None = None) -> TokenDist:
    """Build a distribution from a scenario value: an int (constant) or a mapping
    with `dist:` const | uniform | lognormal | empirical."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return Const(spec)
    if not isinstance(spec, dict):
        raise ScenarioError(f"{where}: expected a number or a mapping with 'dist', got {spec!r}")
    kind = spec.get("dist", "const")
    known = {"dist", "value", "min", "max", "median", "sigma", "values", "weights", "file",
             "column"}
    extra = set(spec) - known
    if extra:
        raise ScenarioError(f"{where}: unknown keys {sorted(extra)}")
    if kind == "const":
        return Const(_int(spec, "value", where))
    if kind == "uniform":
        lo, hi = _int(spec, "min", where), _int(spec, "max", where)
        if lo > hi:
            raise ScenarioError(f"{where}: min {lo} above max {hi}")
        return Uniform(lo, hi)
    if kind == "lognormal":
        median = _float(spec, "median", where)
        if median <= 0:
            raise ScenarioError(f"{where}.median: must be positive")
        return LogNormal(
            median=median, sigma=_float(spec, "sigma", where, 0.5),
            lo=_int(spec, "min", where, 1), hi=_int(spec, "max", where, 1_000_000),
        )
    if kind == "empirical":
        if "file" in spec:
            from triage.sim.paths import resolve_path

            path = resolve_path(str(spec["file"]), base=base)
            return Empirical(column_sample(path, str(spec.get("column", ""))))
        values = spec.get("values")
        if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
            raise ScenarioError(f"{where}.values: expected a list of integers")
        weights = spec.get("weights")
        if weights is not None and not isinstance(weights, list):
            raise ScenarioError(f"{where}.weights: expected a list of numbers")
        return Empirical(list(values), [float(w) for w in weights] if weights else None)
    raise ScenarioError(
        f"{where}.dist: unknown distribution {kind!r} (const, uniform, lognormal, empirical)"
    )
