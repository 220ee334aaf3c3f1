"""The admission app's lock-free counters and histograms must export exactly what
prometheus-client's own would for the same updates (dashboards and alerts read them)."""

from __future__ import annotations

import re
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from triage.streams.tallies import TallyCounter, TallyHistogram

BUCKETS = (0.001, 0.01, 0.1, 1, 10)


def _exposition(counter: type, histogram: type) -> str:
    r = CollectorRegistry()
    c = counter("x_admissions", "Decisions.", ["tenant", "outcome"], registry=r)
    h = histogram("x_wait_seconds", "Waits.", ["tenant"], buckets=BUCKETS, registry=r)
    for v in (0.0005, 0.001, 0.002, 0.5, 1, 3, 20, 0.1):  # on, below and past the bounds
        h.labels("a").observe(v)
    h.labels("b").observe(5)
    c.labels("a", "accept").inc()
    c.labels("a", "accept").inc(2.5)
    c.labels("b", "queue").inc()
    text = generate_latest(r).decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)  # creation times differ


def test_tallies_export_what_prometheus_client_exports() -> None:
    ours = _exposition(TallyCounter, TallyHistogram)
    assert 'x_wait_seconds_bucket{le="0.001",tenant="a"} 2.0' in ours
    assert 'x_wait_seconds_bucket{le="+Inf",tenant="a"} 8.0' in ours
    assert 'x_admissions_total{outcome="accept",tenant="a"} 3.5' in ours
    assert ours == _exposition(Counter, Histogram)


def test_a_counter_refuses_to_go_down_and_labels_must_match() -> None:
    c = TallyCounter("x_total_things", "Things.", ["tenant"], CollectorRegistry())
    with pytest.raises(ValueError, match="only goes up"):
        c.labels("a").inc(-1)
    with pytest.raises(ValueError, match="takes 1 label"):
        c.labels("a", "b")


def test_a_scrape_while_the_writer_adds_series_never_fails() -> None:
    r = CollectorRegistry()
    c = TallyCounter("x_busy", "Busy.", ["n"], r)
    stop = threading.Event()

    def write() -> None:
        for i in range(200_000):
            if stop.is_set():
                return
            c.labels(str(i % 5000)).inc()

    t = threading.Thread(target=write)
    t.start()
    try:
        for _ in range(50):
            assert b"x_busy_total" in generate_latest(r) or not c._children
    finally:
        stop.set()
        t.join()
    total = sum(float(line.rsplit(" ", 1)[1]) for line in generate_latest(r).decode().splitlines()
                if line.startswith("x_busy_total"))
    assert total == sum(ch.value for ch in c._children.values())  # type: ignore[union-attr]
