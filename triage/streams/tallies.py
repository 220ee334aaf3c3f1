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
from typing import Generic, TypeVar

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


ChildT = TypeVar("ChildT", CounterChild, HistogramChild)


class _Family(Generic[ChildT]):
    """What both kinds share: the name, the labels, the children, the registration and
    the scrape; a kind says how to make a child, and how a child reads in its family."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], ChildT] = {}
        registry.register(self)

    def labels(self, *values: str) -> ChildT:
        """The series of these label values (made on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes {len(self.labelnames)} label values "
                                 f"({', '.join(self.labelnames)}), got {len(values)}")
            key = tuple(str(v) for v in values)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._child()
        return child

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for labels, child in list(self._children.items()):  # one C-level copy
            self._add(family, labels, child)
        yield family

    def _child(self) -> ChildT:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError

    def _add(self, family: Metric, labels: tuple[str, ...], child: ChildT) -> None:
        raise NotImplementedError


class TallyCounter(_Family[CounterChild]):
    """A counter family: `labels(...)` gives a child with `inc()`."""

    def _child(self) -> CounterChild:
        return CounterChild()

    def _family(self) -> Metric:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: tuple[str, ...], child: CounterChild) -> None:
        assert isinstance(family, CounterMetricFamily)
        family.add_metric(labels, child.value, created=child.created)


class TallyHistogram(_Family[HistogramChild]):
    """A histogram family: `labels(...)` gives a child with `observe()`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = tuple(bounds)
        self._le: list[str] = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _family(self) -> Metric:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: tuple[str, ...], child: HistogramChild) -> None:
        assert isinstance(family, HistogramMetricFamily)
        cumulative, buckets = 0, []
        for le, n in zip(self._le, list(child.counts), strict=True):
            cumulative += n
            buckets.append((le, float(cumulative)))
        family.add_metric(labels, buckets, child.sum)
        family.samples.append(Sample(f"{self.name}_created",
                                     dict(zip(self.labelnames, labels, strict=True)),
                                     child.created))
