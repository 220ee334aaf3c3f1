"""Utilization hysteresis: tighten first, autoscale after, relax slowly, never flap."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from triage.admission.hysteresis import HysteresisMonitor, HysteresisSettings

S = HysteresisSettings(low=0.65, high=0.75, autoscale_margin=0.05, autoscale_after_s=30.0,
                       relax_after_s=20.0, hold_s=10.0)


def test_tightens_then_autoscales_then_relaxes_after_capacity_arrives() -> None:
    m = HysteresisMonitor(S)
    assert m.update(0.70, 4, 0.0) is None
    assert m.update(0.85, 4, 1.0) == "tighten"
    assert m.update(0.85, 4, 20.0) is None  # hot for 19 s: not yet
    assert m.update(0.85, 4, 31.5) == "autoscale"
    assert m.update(0.50, 4, 40.0) is None  # low, but not for long
    assert m.update(0.50, 6, 61.0) == "autoscale_off"  # new GPUs arrived
    assert m.tightened
    assert m.update(0.50, 6, 70.0) is None  # another quiet window first
    assert m.update(0.50, 6, 82.0) == "relax"
    assert not m.tightened and not m.autoscale


def test_autoscale_ends_without_new_capacity_only_after_a_long_quiet() -> None:
    m = HysteresisMonitor(S)
    m.update(0.9, 4, 0.0)
    m.update(0.9, 4, 31.0)
    assert m.autoscale
    m.update(0.3, 4, 32.0)
    assert m.update(0.3, 4, 53.0) is None  # 21 s low, no new GPUs: keep the signal
    assert m.update(0.3, 4, 73.0) == "autoscale_off"  # 2 x relax window


def test_disabled_monitor_never_flips() -> None:
    m = HysteresisMonitor(S, enabled=False)
    assert m.update(1.0, 1, 0.0) is None and not m.tightened


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 20.0), st.floats(0.0, 1.0), st.integers(1, 8)),
                max_size=200))
def test_never_flips_twice_within_the_hold_time(
    readings: list[tuple[float, float, int]]
) -> None:
    m = HysteresisMonitor(S)
    now = 0.0
    for dt, util, gpus in readings:
        now += dt
        m.update(util, gpus, now)
    times = [t for t, _ in m.flips]
    assert all(b - a >= S.hold_s for a, b in itertools.pairwise(times))
    # and the states only move through their legal order
    for (_, a), (_, b) in zip(m.flips, m.flips[1:], strict=False):
        assert (a, b) in {
            ("tighten", "autoscale"), ("tighten", "relax"), ("autoscale", "autoscale_off"),
            ("autoscale_off", "relax"), ("relax", "tighten"), ("autoscale_off", "autoscale"),
        }


def test_a_tightened_pool_holds_tight_sla_tenants_only_far_over_their_share() -> None:
    """The tightened hold keeps KV headroom for tight-SLA work, so under the full policy a
    tenant whose contracted SLA is within 2x the pool's tightest is held back only past
    twice its fair share (others past 1.1x); the baselines hold every tenant at 1.1x.
    On `long-context` this passes the 100% case and lifts 120% (docs/experiments.md)."""
    from _core_factory import config, tenant

    from triage.admission.core import AdmissionCore
    from triage.config.models import PolicyConfig, PolicyPreset, TenantConfig

    cfg = config(tenants=[tenant("chat", sla_ms=10_000), tenant("agent", sla_ms=20_000),
                          tenant("batch", sla_ms=60_000)], gpus=1)
    full = AdmissionCore(cfg).dispatchers["p"]
    assert [full._hold_tolerance(t) for t in ("chat", "agent", "batch")] == [1.0, 1.0, 0.1]
    vtc = AdmissionCore(cfg, policy=PolicyConfig(preset=PolicyPreset.VTC)).dispatchers["p"]
    assert [vtc._hold_tolerance(t) for t in ("chat", "agent", "batch")] == [0.1, 0.1, 0.1]
    core = AdmissionCore(cfg)  # a tenant added while running joins the class at once
    core.add_tenant(TenantConfig.model_validate(tenant("late", sla_ms=5_000)))
    d = core.dispatchers["p"]
    assert [d._hold_tolerance(t) for t in ("late", "chat", "batch")] == [1.0, 1.0, 0.1]
    off = AdmissionCore(cfg, policy=PolicyConfig(tight_sla_ratio=0.0)).dispatchers["p"]
    assert off._hold_tolerance("chat") == 0.1
