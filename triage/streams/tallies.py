"""Counters and histograms for the admission app's per-decision series, kept in plain
Python by their one writer (the event loop) and read by the scrape's thread.

prometheus-client's own take a lock per update and walk their buckets in Python; with
about nine updates per request they cost ~7% of the handlers' instructions
(docs/architecture.md, "The admission app's per-request cost"). These export the same
families, samples and names (`_total`, `_bucket`, `_sum`, `_count`, `_created`), so
dashboards and alerts do not change. One writer: an update is a plain `+=`, safe
because only the event loop's thread updates; a scrape may see a histogram's sum one
observation ahead of its buckets, as prometheus-client's own may.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class CounterChild:
    """One labelled series of a TallyCounter."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up: inc({amount})")
        self.value += amount


class HistogramChild:
    """One labelled series of a TallyHistogram: a count per bucket (not cumulative)."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # the first bucket whose upper bound is at or above `amount` (`le` semantics)
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _Family:
    """What both kinds share: the name, the labels, the children, the registration."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], CounterChild | HistogramChild] = {}
        registry.register(self)

    def _labels(self, values: tuple[str, ...]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes {len(self.labelnames)} label values "
                             f"({', '.join(self.labelnames)}), got {len(values)}")
        return tuple(str(v) for v in values)

    def _snapshot(self) -> list[tuple[tuple[str, ...], CounterChild | HistogramChild]]:
        return list(self._children.items())  # one C-level copy: no Python runs between

    def describe(self) -> Iterator[Metric]:
        yield self._empty()

    def _empty(self) -> Metric:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        raise NotImplementedError


class TallyCounter(_Family):
    """A counter family: `labels(...)` gives a child with `inc()`."""

    def labels(self, *values: str) -> CounterChild:
        key = self._labels(values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = CounterChild()
        assert isinstance(child, CounterChild)
        return child

    def _empty(self) -> Metric:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, child in self._snapshot():
            assert isinstance(child, CounterChild)
            family.add_metric(labels, child.value, created=child.created)
        yield family


class TallyHistogram(_Family):
    """A histogram family: `labels(...)` gives a child with `observe()`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = tuple(bounds)
        self._le: list[str] = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: str) -> HistogramChild:
        key = self._labels(values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = HistogramChild(self.bounds)
        assert isinstance(child, HistogramChild)
        return child

    def _empty(self) -> Metric:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, child in self._snapshot():
            assert isinstance(child, HistogramChild)
            counts, total = list(child.counts), child.sum
            cumulative, buckets = 0, []
            for le, n in zip(self._le, counts, strict=True):
                cumulative += n
                buckets.append((le, float(cumulative)))
            family.add_metric(labels, buckets, total)
            family.samples.append(Sample(f"{self.name}_created",
                                         dict(zip(self.labelnames, labels, strict=True)),
                                         child.created))
        yield family
