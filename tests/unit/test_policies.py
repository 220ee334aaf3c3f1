"""Policies as configuration: each baseline behaves as defined, from the same core."""

from __future__ import annotations

from collections import Counter

from _core_factory import config, tenant

from triage.admission.core import AdmissionCore
from triage.admission.policy import resolve_policy
from triage.config.models import PolicyConfig, PolicyPreset
from triage.topics.reasons import Outcome, ReasonCode

QUOTA_REASONS = {ReasonCode.TENANT_QUOTA_EXCEEDED, ReasonCode.TENANT_RATE_LIMITED,
                 ReasonCode.QUOTA_NEVER_FITS}


def _flood(preset: str) -> Counter[tuple[Outcome, ReasonCode]]:
    """A tenant far beyond its quota on a small pool: every check has work to do (refusals
    by the pool refund their charge, so the quota binds through what was admitted)."""
    cfg = config(
        tenants=[tenant("a", rate_tokens_per_s=100, burst_tokens=4000, queue_max=5,
                        max_queue_wait_ms=500, sla_ms=3000)],
        gpus=1, kv_budget_gib=0.25, policy={"preset": preset},
    )
    core = AdmissionCore(cfg)
    seen: Counter[tuple[Outcome, ReasonCode]] = Counter()
    now = 0.0
    for i in range(300):
        now += 0.02
        for x in core.submit(f"r{i}", "a", "m8", 400, 300, now) + core.tick(now):
            seen[(x.outcome, x.reason)] += 1
        d = core.dispatchers["p"]
        if i % 40 == 0 and d.inflight:
            p = next(iter(d.inflight.values()))
            for x in core.complete(pool="p", request_id=p.request_id, attempt=p.attempt,
                                   ok=True, output_tokens=100, prefill_s=0.01, decode_s=1.0,
                                   concurrency=float(p.gpu.running), now=now):  # type: ignore[attr-defined]
                seen[(x.outcome, x.reason)] += 1
    return seen


def outcomes(seen: Counter[tuple[Outcome, ReasonCode]]) -> set[Outcome]:
    return {o for o, _ in seen}


def test_admit_all_never_refuses_nor_queues() -> None:
    seen = _flood("admit_all")
    assert outcomes(seen) <= {Outcome.ACCEPT, Outcome.COMPLETE}
    assert seen[(Outcome.ACCEPT, ReasonCode.ADMITTED)] == 300


def test_reject_only_never_queues() -> None:
    seen = _flood("reject_only")
    assert Outcome.QUEUE not in outcomes(seen)
    reasons = {r for o, r in seen if o is Outcome.REJECT}
    assert reasons & QUOTA_REASONS and reasons - QUOTA_REASONS  # quota and capacity refusals


def test_rate_limit_only_refuses_for_quota_alone() -> None:
    seen = _flood("rate_limit_only")
    assert Outcome.QUEUE not in outcomes(seen)
    assert {r for o, r in seen if o is Outcome.REJECT} <= QUOTA_REASONS
    assert any(o is Outcome.REJECT for o, _ in seen)


def test_bounded_queue_queues_and_times_out_but_ignores_quota() -> None:
    seen = _flood("bounded_queue")
    assert Outcome.QUEUE in outcomes(seen) and Outcome.TIMEOUT in outcomes(seen)
    assert not {r for o, r in seen if o is Outcome.REJECT} & QUOTA_REASONS


def test_full_policy_uses_every_kind_of_answer() -> None:
    seen = _flood("full")
    assert {Outcome.ACCEPT, Outcome.QUEUE, Outcome.REJECT} <= outcomes(seen)


def test_explicit_flags_override_the_preset() -> None:
    flags = resolve_policy(PolicyConfig(preset=PolicyPreset.FULL, name="no-preempt",
                                        preemption=False, variance_buffer=1.0))
    assert flags.name == "no-preempt" and not flags.preemption and flags.variance_buffer == 1.0
    assert flags.quota and flags.memory_fit and flags.sla_fit and flags.queue
    baseline = resolve_policy(PolicyConfig(preset=PolicyPreset.REJECT_ONLY))
    assert baseline.name == "reject_only" and not baseline.queue
