"""Workload generators: rates, shapes, clamps, determinism and lazy merging."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.unit._sim_factory import sim_config
from triage.sim.arrivals import Daily, OnOff, Poisson, Profile, Steady, parse_arrivals
from triage.sim.dists import Const, Empirical, LogNormal, Uniform, parse_dist
from triage.sim.errors import ScenarioError
from triage.sim.workload import Arrival, Workload, generate, merge_streams, overflows, shape


def _count(proc: object, end: float, seed: int = 1) -> int:
    return sum(1 for _ in proc.times(random.Random(seed), end))  # type: ignore[attr-defined]


def test_poisson_and_steady_rates() -> None:
    assert _count(Poisson(20.0), 500.0) == pytest.approx(10_000, rel=0.05)
    assert _count(Steady(4.0), 100.0) == 400
    times = list(Steady(2.0).times(random.Random(1), 3.0))
    assert times == [0.25, 0.75, 1.25, 1.75, 2.25, 2.75]


def test_onoff_mean_rate_and_bursts() -> None:
    proc = OnOff(on_rate=30.0, off_rate=0.0, on_s=10.0, off_s=30.0, random_periods=False)
    assert proc.mean_rate(400.0) == pytest.approx(7.5)
    times = list(proc.times(random.Random(2), 400.0))
    assert len(times) == pytest.approx(3000, rel=0.1)
    assert all((t % 40.0) >= 30.0 for t in times)  # off first, then on: nothing while off


def test_daily_spike_lands_in_its_hour() -> None:
    proc = Daily(trough_rate=1.0, peak_rate=1.0, spike_rate=20.0, spike_hour=9.0, spike_h=0.25,
                 start_hour=8.5, day_s=86_400.0)
    times = list(proc.times(random.Random(3), 3600.0))
    in_spike = [t for t in times if 1800.0 <= t < 2700.0]
    assert len(in_spike) == pytest.approx(21 * 900, rel=0.05)
    assert len(times) - len(in_spike) == pytest.approx(2700, rel=0.1)
    # compressing the day moves the spike with it
    half = proc.scaled(0.5)
    assert half.rate(900.0 + 1.0) == pytest.approx(21.0)
    assert half.rate(600.0) == pytest.approx(1.0)


def test_profile_is_piecewise_and_repeats() -> None:
    proc = Profile(points=((0.0, 1.0), (10.0, 50.0), (20.0, 1.0)), repeat_s=30.0)
    assert proc.rate(15.0) == 50.0 and proc.rate(45.0) == 50.0 and proc.rate(25.0) == 1.0
    assert proc.mean_rate(60.0) == pytest.approx((10 + 500 + 10) / 30.0)
    times = list(proc.times(random.Random(1), 60.0))
    assert sum(1 for t in times if 40 <= t < 50) > 8 * sum(1 for t in times if 30 <= t < 40)


def test_distributions_clamp_and_parse() -> None:
    rng = random.Random(1)
    ln = LogNormal(median=100.0, sigma=1.5, lo=10, hi=400)
    xs = [ln.sample(rng) for _ in range(5000)]
    assert min(xs) == 10 and max(xs) == 400
    assert sorted(xs)[2500] == pytest.approx(100, rel=0.1)
    emp = Empirical([1, 2, 3], [0.0, 1.0, 0.0])
    assert {emp.sample(rng) for _ in range(100)} == {2}
    assert isinstance(parse_dist(64, "x"), Const)
    assert isinstance(parse_dist({"dist": "uniform", "min": 1, "max": 3}, "x"), Uniform)
    with pytest.raises(ScenarioError, match="unknown distribution"):
        parse_dist({"dist": "zipf"}, "x")
    with pytest.raises(ScenarioError, match="rate"):
        parse_arrivals({"process": "poisson", "rate": -1}, "x")


def test_shape_never_clamps_what_the_client_asked() -> None:
    # an explicit max_tokens is the client's: output capped at it, nothing fitted
    assert shape(100, 50, 80, 4096, False) == (100, 50, 50)
    assert shape(5000, 2000, 10, 4096, False) == (5000, 2000, 10)  # context_overflow
    # a derived max_tokens (output x factor) is fitted into the context, never below
    # the output the request really generated
    assert shape(3000, 2000, 10, 4096, True) == (3000, 1096, 10)
    assert shape(4090, 30, 20, 4096, True) == (4090, 20, 20)  # still overflows: 4110
    a = Arrival(0.0, "t", "m", 5000, 2000, 10)
    assert overflows(a, 4096) and not overflows(a, 8192)


def test_generate_is_deterministic_ordered_and_lazy() -> None:
    cfg = sim_config()
    ws = [
        Workload(tenant="a", model="m8", arrivals=Poisson(5.0), prompt=Const(10),
                 output=Const(5), max_tokens=Const(8)),
        Workload(tenant="b", model="m8", arrivals=Steady(3.0), prompt=Const(20),
                 output=Const(50), max_factor=1.5, max_cap=60),
    ]
    one = list(generate(ws, cfg, seed=9, duration_s=100.0))
    two = list(generate(ws, cfg, seed=9, duration_s=100.0))
    assert one == two
    assert one != list(generate(ws, cfg, seed=10, duration_s=100.0))
    assert all(x.t <= y.t for x, y in itertools.pairwise(one))
    b = [a for a in one if a.tenant == "b"]
    assert len(b) == 300 and all(a.max_tokens == 60 and a.output_tokens == 50 for a in b)
    # an endless stream yields its first requests at once
    first = list(itertools.islice(generate(ws, cfg, seed=9, duration_s=1e12), 5))
    assert len(first) == 5


def test_merge_streams_breaks_ties_by_stream_order() -> None:
    a = iter([Arrival(1.0, "a", "m", 1, 1, 1), Arrival(2.0, "a", "m", 1, 1, 1)])
    b = iter([Arrival(1.0, "b", "m", 1, 1, 1)])
    assert [x.tenant for x in merge_streams([a, b])] == ["a", "b", "a"]
