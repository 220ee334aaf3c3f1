"""Check 5: online workload prediction and the variance buffer."""

from __future__ import annotations

import bisect
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from triage.admission.predictor import (
    CostModel,
    OutputRatio,
    VarianceBuffer,
    WorkloadPredictor,
    _bisect,
)


def test_priors_predict_before_any_completion() -> None:
    cm = CostModel(prefill_s_per_token=1e-4, decode_s_per_token=0.01, batch_slowdown=0.1,
                   half_life=100)
    assert math.isclose(cm.predict(1000, 100, 1.0), 0.1 + 1.0)
    assert math.isclose(cm.predict(0, 100, 11.0), 100 * 0.01 * 2.0)


def test_fit_learns_the_true_timing_model() -> None:
    cm = CostModel(prefill_s_per_token=1e-3, decode_s_per_token=0.05, batch_slowdown=0.0,
                   half_life=200)
    rng = random.Random(3)
    for _ in range(3000):
        prompt = rng.randint(100, 4000)
        out = rng.randint(10, 500)
        n = rng.randint(1, 32)
        per_token = 0.008 * (1 + 0.03 * (n - 1))
        cm.observe(prompt_tokens=prompt, prefill_s=prompt * 2e-5, output_tokens=out,
                   decode_s=out * per_token, concurrency=n)
    b0, b1 = cm.decode_coefficients()
    assert math.isclose(cm.prefill_s_per_token, 2e-5, rel_tol=0.02)
    assert math.isclose(b0, 0.008, rel_tol=0.05)
    assert math.isclose(b1, 0.008 * 0.03, rel_tol=0.1)


def test_output_ratio_is_learned_not_fixed() -> None:
    r = OutputRatio(prior=0.7, half_life=50)
    for _ in range(500):
        r.observe(30, 100)
    assert math.isclose(r.value, 0.3, rel_tol=0.02)


def test_variance_buffer_starts_at_prior_then_follows_the_error_quantile() -> None:
    vb = VarianceBuffer(initial=1.3, target_miss_rate=0.1, window=200, min_samples=50)
    assert vb.value == 1.3
    for _i in range(49):
        vb.observe(1.0, 1.0)
    assert vb.value == 1.3
    rng = random.Random(0)
    ratios = [rng.uniform(0.5, 2.0) for _ in range(200)]
    for r in ratios:
        vb.observe(r, 1.0)
    expected = sorted(ratios)[math.ceil(0.9 * 200) - 1]
    assert math.isclose(vb.value, expected)
    # the quantile meets the target miss rate on its own window
    misses = sum(1 for r in ratios if r > vb.value)
    assert misses <= 0.1 * len(ratios)


def test_buffer_never_below_one() -> None:
    vb = VarianceBuffer(initial=1.3, target_miss_rate=0.05, window=50, min_samples=10)
    for _ in range(100):
        vb.observe(0.5, 1.0)
    assert vb.value == 1.0


def test_fixed_buffer_does_not_adapt() -> None:
    vb = VarianceBuffer(initial=1.0, target_miss_rate=0.05, window=50, min_samples=10,
                        adaptive=False)
    for _ in range(200):
        vb.observe(3.0, 1.0)
    assert vb.value == 1.0


def _predictor(**kw: float) -> WorkloadPredictor:
    return WorkloadPredictor(
        model_priors={"small": (2e-5, 0.008, 0.0), "big": (8e-5, 0.03, 0.0)},
        gpu_speed={"H200": 1.0}, tenant_priors={"t": 1.0}, min_samples=20,
        half_life=50, **kw,  # type: ignore[arg-type]
    )


def _complete(p: WorkloadPredictor, model: str, per_token: float, n: int = 1) -> None:
    p.observe(tenant="t", model=model, gpu_type="H200", prompt_tokens=100, output_tokens=100,
              max_tokens=100, prefill_s=0.0, decode_s=100 * per_token, concurrency=n,
              expected_out=100.0, dispatch_concurrency=n)


def test_buffer_forgets_the_errors_of_a_cold_fit() -> None:
    """300 requests dispatched under a prior 4x too fast complete: each is compared with
    the fit as it stands, so the buffer holds the fit's lag (< 2), not the prior's error
    (4 on every one, which refused everything as infeasible and never recovered)."""
    p = _predictor()
    for _ in range(300):
        _complete(p, "small", 0.032)
    assert p.cost_model("small", "H200").predict(0, 100, 1.0) > 3.0
    assert 1.0 < p.buffer_value("small") < 2.0


def test_buffers_are_per_model_and_capped() -> None:
    p = _predictor(max_buffer=2.0)
    rng = random.Random(1)
    for _ in range(300):  # the big model's timing swings 1x..8x around its fit
        _complete(p, "big", 0.03 * rng.choice([1.0, 1.0, 8.0]))
    assert p.buffer_value("big") == 2.0  # capped: past it the fit is wrong, not noisy
    assert p.buffer_value("small") == 1.3  # untouched by the other model's errors
    assert p.variance_buffer == 2.0


def test_snapshot_restores_per_model_buffers() -> None:
    p = _predictor()
    rng = random.Random(2)
    for _ in range(100):
        _complete(p, "big", 0.03 * rng.uniform(0.8, 1.6))
    q = _predictor()
    q.restore(p.snapshot())
    assert q.buffer_value("big") == p.buffer_value("big")
    assert q.buffer_value("small") == 1.3


@settings(max_examples=200, deadline=None)
@given(
    xs=st.lists(st.sampled_from([0.5, 1.0, 1.3, 2.0]) | st.floats(0.0, 10.0), max_size=60),
    x=st.sampled_from([0.5, 1.0, 1.3, 2.0]) | st.floats(0.0, 10.0) | st.just(float("inf")),
)
def test_the_buffers_bisect_matches_the_bisect_module(xs: list[float], x: float) -> None:
    a = sorted(xs)
    assert _bisect(a, x, False) == bisect.bisect_left(a, x)
    assert _bisect(a, x, True) == bisect.bisect_right(a, x)
