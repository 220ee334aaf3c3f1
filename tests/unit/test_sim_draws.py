"""The simulator's own exponential and lognormal draws (compiled with it) must be
bit-identical to random.Random's, so workloads do not change with the build."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from triage.sim.dists import expovariate, lognormvariate


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    rate=st.floats(1e-3, 1e4),
    mu=st.floats(-5.0, 12.0),
    sigma=st.floats(0.01, 3.0),
)
def test_draws_match_the_random_module_bit_for_bit(
    seed: int, rate: float, mu: float, sigma: float
) -> None:
    ours, theirs = random.Random(seed), random.Random(seed)
    for _ in range(200):
        assert expovariate(ours, rate) == theirs.expovariate(rate)
        assert lognormvariate(ours, mu, sigma) == theirs.lognormvariate(mu, sigma)
    assert ours.random() == theirs.random()  # the streams stayed in step
