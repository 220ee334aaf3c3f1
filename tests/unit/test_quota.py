"""Check 1: the token bucket with borrowing, and the gate built on it."""

from __future__ import annotations

import itertools
import math

from _core_factory import config, tenant
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.admission.core import AdmissionCore
from triage.admission.quota import OfferedLoad, TokenBucket
from triage.topics.reasons import Outcome, ReasonCode


def test_full_bucket_admits_burst_then_refuses() -> None:
    b = TokenBucket(rate=10.0, burst=100.0)
    assert b.admits(100.0, borrowing=False)
    b.take(100.0)
    assert not b.admits(1.0, borrowing=False)
    assert b.wait_s(50.0, borrowing=False) == 5.0


def test_borrowing_goes_into_debt_up_to_the_ceiling() -> None:
    b = TokenBucket(rate=10.0, burst=100.0, max_debt=50.0)
    assert b.admits(150.0, borrowing=True)
    assert not b.admits(151.0, borrowing=True)
    b.take(150.0)
    assert b.debt == 50.0 and b.tokens == 0.0


def test_debt_is_repaid_before_the_bucket_refills() -> None:
    b = TokenBucket(rate=10.0, burst=100.0, max_debt=50.0, updated=0.0)
    b.take(150.0)  # 50 in debt
    b.refill(3.0)  # +30: still 20 in debt, no tokens
    assert b.debt == 20.0 and b.tokens == 0.0
    b.refill(7.0)  # +40: debt paid, 20 tokens
    assert b.debt == 0.0 and b.tokens == 20.0


def test_retry_hint_is_exact() -> None:
    b = TokenBucket(rate=7.0, burst=100.0, max_debt=30.0, updated=0.0)
    b.take(125.0)  # level -25
    wait = b.wait_s(60.0, borrowing=True)
    assert wait is not None
    b.refill(wait - 1e-6)
    assert not b.admits(60.0, borrowing=True)
    b.refill(wait)
    assert b.admits(60.0, borrowing=True)


def test_cost_above_burst_plus_debt_never_fits() -> None:
    b = TokenBucket(rate=1.0, burst=10.0, max_debt=5.0)
    assert b.wait_s(16.0, borrowing=True) is None
    assert b.wait_s(15.0, borrowing=True) is not None


def test_clock_stepping_back_changes_nothing() -> None:
    b = TokenBucket(rate=1.0, burst=10.0, level=2.0, updated=5.0)
    b.refill(4.0)
    assert b.level == 2.0 and b.updated == 5.0


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 1e4), burst=st.floats(1.0, 1e5), debt=st.floats(0.0, 1e5),
    ops=st.lists(st.tuples(st.floats(0.0, 50.0), st.floats(0.0, 2e5), st.booleans()), max_size=60),
)
def test_bucket_never_above_burst_nor_beyond_its_debt_ceiling(
    rate: float, burst: float, debt: float, ops: list[tuple[float, float, bool]]
) -> None:
    b = TokenBucket(rate=rate, burst=burst, max_debt=debt, updated=0.0)
    now = 0.0
    for dt, cost, borrowing in ops:
        now += dt
        b.refill(now)
        if b.admits(cost, borrowing):
            b.take(cost)
        assert b.tokens <= burst + 1e-9
        assert b.debt <= debt + 1e-6 * max(1.0, debt)


def test_offered_load_tracks_a_steady_rate() -> None:
    load = OfferedLoad(half_life_s=5.0)
    rate = 0.0
    for i in range(2000):
        rate = load.add(100.0, i * 0.1)  # 1,000 tokens/s
    assert math.isclose(rate, 1000.0, rel_tol=0.05)


def _core(*, conserving: bool = False, **tkw: object) -> AdmissionCore:
    """One tenant on 8 idle GPUs. The bucket's own mechanics are tested with work
    conservation off (with it on, an idle pool serves over-quota requests as overage)."""
    return AdmissionCore(config(
        tenants=[tenant("a", **tkw)], kv_budget_gib=64.0, gpus=8,
        policy={"preset": "full", "overage_when_idle": conserving},
    ))


def test_gate_refuses_over_quota_with_the_exact_hint_and_admits_at_it() -> None:
    core = _core(rate_tokens_per_s=100.0, burst_tokens=1000.0, output_ratio_prior=1.0)
    first = core.submit("r1", "a", "m8", 900, 100, now=0.0)[0]
    assert first.outcome is Outcome.ACCEPT
    refused = core.submit("r2", "a", "m8", 400, 100, now=1.0)[0]
    assert refused.outcome is Outcome.REJECT
    assert refused.reason is ReasonCode.TENANT_QUOTA_EXCEEDED
    assert refused.retry_after_s is not None
    assert math.isclose(refused.retry_after_s, 4.0)  # 100 tokens at t=1, 500 needed, 100/s
    early = core.submit("r3", "a", "m8", 400, 100, now=1.0 + refused.retry_after_s - 0.01)[0]
    assert early.outcome is Outcome.REJECT
    on_time = core.submit("r4", "a", "m8", 400, 100, now=1.0 + refused.retry_after_s)[0]
    assert on_time.outcome is Outcome.ACCEPT


def test_gate_request_rate_limit() -> None:
    core = _core(max_requests_per_s=2.0)
    outs = [core.submit(f"r{i}", "a", "m8", 10, 10, now=0.0)[0] for i in range(3)]
    assert [o.outcome for o in outs] == [Outcome.ACCEPT, Outcome.ACCEPT, Outcome.REJECT]
    assert outs[2].reason is ReasonCode.TENANT_RATE_LIMITED
    assert outs[2].retry_after_s == 0.5


def test_overage_admits_at_reduced_priority_without_touching_the_bucket() -> None:
    core = _core(rate_tokens_per_s=10.0, burst_tokens=100.0, allow_overage=True,
                 output_ratio_prior=1.0)
    core.submit("r1", "a", "m8", 90, 10, now=0.0)
    level = core.gate.bucket("a").level
    d = core.submit("r2", "a", "m8", 90, 10, now=0.0)[0]
    assert d.outcome is Outcome.ACCEPT and d.overage is True
    assert core.gate.bucket("a").level == level


def test_quota_that_can_never_fit_has_no_retry_hint() -> None:
    core = _core(rate_tokens_per_s=10.0, burst_tokens=100.0, output_ratio_prior=1.0)
    d = core.submit("r1", "a", "m8", 150, 10, now=0.0)[0]
    assert d.reason is ReasonCode.QUOTA_NEVER_FITS and d.retry_after_s is None


def test_borrowing_is_suspended_while_the_pool_is_tightened() -> None:
    core = _core(rate_tokens_per_s=10.0, burst_tokens=100.0, max_debt_tokens=100.0,
                 output_ratio_prior=1.0)
    core.dispatchers["p"].monitor.tightened = True
    d = core.submit("r1", "a", "m8", 140, 10, now=0.0)[0]
    assert d.reason is ReasonCode.TENANT_QUOTA_EXCEEDED
    core.dispatchers["p"].monitor.tightened = False
    d = core.submit("r2", "a", "m8", 140, 10, now=0.0)[0]
    assert d.outcome is Outcome.ACCEPT


# --- work conservation, settlement and retry hints (issue 9, causes 2, 7, 9) -------------

def _saturate(core: AdmissionCore) -> None:
    m = core.dispatchers["p"].monitor
    m.utilization = m.settings.high + 0.1


def test_over_quota_runs_as_overage_while_the_pool_is_idle_and_is_refused_when_saturated() -> None:
    core = _core(conserving=True, rate_tokens_per_s=100.0, burst_tokens=1000.0,
                 output_ratio_prior=1.0)
    assert core.submit("r1", "a", "m8", 900, 100, now=0.0)[0].outcome is Outcome.ACCEPT
    level = core.gate.bucket("a").level
    idle = core.submit("r2", "a", "m8", 400, 100, now=1.0)[0]
    assert idle.outcome is Outcome.ACCEPT and idle.overage is True
    # refilled for 1 s, and not charged for the overage: no extra debt
    assert math.isclose(core.gate.bucket("a").level, level + 100.0)
    _saturate(core)
    busy = core.submit("r3", "a", "m8", 400, 100, now=1.0)[0]
    assert busy.outcome is Outcome.REJECT and busy.reason is ReasonCode.TENANT_QUOTA_EXCEEDED


def test_a_refusal_by_the_pool_refunds_its_charge() -> None:
    core = AdmissionCore(config(
        tenants=[tenant("a", rate_tokens_per_s=1.0, burst_tokens=10_000.0, sla_ms=1)],
        kv_budget_gib=64.0, gpus=1,
    ))
    before = core.gate.bucket("a").level
    d = core.submit("r1", "a", "m8", 5000, 100, now=0.0)[0]
    assert d.outcome is Outcome.REJECT and d.reason is ReasonCode.SLA_INFEASIBLE
    assert math.isclose(core.gate.bucket("a").level, before)  # refusals cost nothing


def test_a_queue_timeout_refunds_and_a_completion_settles_to_the_tokens_used() -> None:
    core = AdmissionCore(config(
        tenants=[tenant("a", rate_tokens_per_s=1e-6, burst_tokens=100_000.0,
                        output_ratio_prior=1.0, max_queue_wait_ms=500)],
        kv_budget_gib=0.1, gpus=1,
    ))
    b = core.gate.bucket("a")
    big = core.submit("big", "a", "m8", 500, 100, now=0.0)[0]  # holds most of the KV
    assert big.outcome is Outcome.ACCEPT and math.isclose(b.level, 100_000.0 - 600.0)
    waits = core.submit("w", "a", "m8", 300, 100, now=0.0)[0]
    assert waits.outcome is Outcome.QUEUE
    assert math.isclose(b.level, 100_000.0 - 1000.0)
    timed_out = [d for d in core.tick(0.6) if d.request_id == "w"]
    assert timed_out and timed_out[0].outcome is Outcome.TIMEOUT
    assert math.isclose(b.level, 100_000.0 - 600.0, abs_tol=1e-3)  # the wait cost nothing
    core.complete(pool="p", request_id="big", attempt=0, ok=True, output_tokens=10,
                  prefill_s=0.1, decode_s=0.1, concurrency=1.0, now=1.0)
    assert math.isclose(b.level, 100_000.0 - 510.0, abs_tol=1e-3)  # 500 prompt + 10 used


def test_retry_hints_queue_refused_requests_behind_each_other() -> None:
    core = _core(rate_tokens_per_s=100.0, burst_tokens=1000.0, output_ratio_prior=1.0)
    core.submit("r0", "a", "m8", 900, 100, now=0.0)  # bucket empty
    hints = [core.submit(f"r{i}", "a", "m8", 400, 100, now=0.0)[0].retry_after_s
             for i in range(1, 5)]
    assert hints[0] is not None and math.isclose(hints[0], 5.0)  # its 500 tokens at 100/s
    for before, after in itertools.pairwise(hints):
        assert before is not None and after is not None
        assert math.isclose(after - before, 5.0)  # each needs its own 500 tokens after
