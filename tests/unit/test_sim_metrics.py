"""Metric building blocks: histogram percentiles, bounded series, fairness, policy table."""

from __future__ import annotations

import random

import pytest

from triage.admission.policy import resolve_policy
from triage.sim.errors import PolicyNameError
from triage.sim.fairshare import fairness, water_fill
from triage.sim.histogram import NBUCKETS, LogHistogram
from triage.sim.policies import VARIANTS, parse_policies, policy_config
from triage.sim.series import TimeSeries


def test_histogram_percentiles_within_two_percent() -> None:
    rng = random.Random(1)
    xs = [rng.lognormvariate(0.0, 1.2) for _ in range(50_000)]
    h = LogHistogram()
    for x in xs:
        h.add(x)
    xs.sort()
    for q in (0.5, 0.95, 0.99):
        exact = xs[int(q * len(xs)) - 1]
        got = h.quantile(q)
        assert got is not None
        assert got == pytest.approx(exact, rel=0.025)
    assert len(h.counts) == NBUCKETS and h.count == len(xs)
    assert h.cdf()[1][-1] == pytest.approx(1.0)
    assert LogHistogram().quantile(0.5) is None


def test_series_merges_slots_and_keeps_totals() -> None:
    s = TimeSeries(interval=1.0, max_points=8)
    for t in range(100):
        s.add("c", t + 0.5, 1.0)
        s.set("g", t + 0.5, float(t))
    assert s.n <= 8 and s.interval == 16.0
    assert sum(s.counter("c")) == 100.0
    assert 0.0 <= s.gauge("g")[0] <= 15.0  # a reading (or mean of readings) of its slot
    assert s.to_dict()["interval_s"] == 16.0


def test_water_fill_is_weighted_max_min() -> None:
    alloc = water_fill({"a": 100.0, "b": 10.0, "c": 100.0}, {"a": 2.0, "b": 1.0, "c": 1.0}, 100.0)
    assert alloc["b"] == pytest.approx(10.0)  # small demand fully served
    assert alloc["a"] == pytest.approx(60.0) and alloc["c"] == pytest.approx(30.0)


def _series(served: dict[str, float], demand: dict[str, float], slots: int = 10) -> TimeSeries:
    s = TimeSeries(interval=1.0)
    for i in range(slots):
        for t in served:
            s.add("served:" + t, i + 0.5, served[t])
            s.add("demand:" + t, i + 0.5, demand[t])
    return s


def test_fairness_rewards_weighted_shares_and_ignores_over_quota_demand() -> None:
    weights = {"a": 2.0, "b": 1.0}
    rates = {"a": 1e9, "b": 1e9}
    fair = _series({"a": 200.0, "b": 100.0}, {"a": 1000.0, "b": 1000.0})
    jain, gap, _ = fairness(fair, weights, rates)
    assert jain == pytest.approx(1.0) and gap == pytest.approx(0.0)
    unfair = _series({"a": 100.0, "b": 200.0}, {"a": 1000.0, "b": 1000.0})
    jain2, gap2, _ = fairness(unfair, weights, rates)
    assert jain2 is not None and jain2 < 0.9 and gap2 is not None and gap2 > 1.0
    # b asks for 10x its contract: only its contract is owed, so serving it less is fair
    capped = _series({"a": 250.0, "b": 50.0}, {"a": 1000.0, "b": 1000.0})
    jain3, _, ratios3 = fairness(capped, weights, {"a": 1e9, "b": 50.0})
    assert jain3 == pytest.approx(1.0) and ratios3["b"] == pytest.approx(1.0)
    assert fairness(_series({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}), weights, rates)[0] is None


def test_policy_variants_are_configurations_of_one_core() -> None:
    flags = {name: resolve_policy(policy_config(name)) for name in VARIANTS}
    assert flags["full"].queue and flags["full"].preemption and flags["full"].sla_fit
    assert not flags["admit_all"].memory_fit and not flags["admit_all"].queue
    assert flags["reject_only"].memory_fit and not flags["reject_only"].queue
    assert flags["rate_limit_only"].quota and not flags["rate_limit_only"].memory_fit
    assert flags["bounded_queue"].queue and not flags["bounded_queue"].quota
    assert flags["full-nobuffer"].variance_buffer == 1.0
    assert not flags["full-noborrow"].borrowing and flags["full-noborrow"].quota
    assert not flags["full-nopreempt"].preemption and flags["full-nopreempt"].queue
    assert flags["full-nopreempt"].name == "full-nopreempt"
    custom = resolve_policy(policy_config("full+variance_buffer=1.3+preemption=false"))
    assert custom.variance_buffer == 1.3 and not custom.preemption
    assert parse_policies("full, admit_all,full") == ["full", "admit_all"]
    with pytest.raises(PolicyNameError, match="unknown policy"):
        policy_config("fastest")
    with pytest.raises(PolicyNameError, match="variance_buffer"):
        policy_config("full+variance_buffer=0.5")
