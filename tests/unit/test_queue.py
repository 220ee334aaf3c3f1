"""The bounded queue: bounds, timeouts with hints, nothing dropped silently."""

from __future__ import annotations

from _core_factory import config, tenant

from triage.admission.core import AdmissionCore
from triage.topics.reasons import Outcome, ReasonCode


def _full_core(**kw: object) -> AdmissionCore:
    cfg = config(tenants=[tenant("a", queue_max=3, max_queue_wait_ms=1000, **kw),
                          tenant("b", queue_max=10, max_queue_wait_ms=1000)],
                 gpus=1, kv_budget_gib=0.1, queue_max=5)
    core = AdmissionCore(cfg)
    assert core.submit("big", "a", "m8", 600, 100, 0.0)[0].outcome is Outcome.ACCEPT
    return core


def test_tenant_queue_bound_refuses_with_a_drain_hint() -> None:
    core = _full_core()
    outs = [core.submit(f"a{i}", "a", "m8", 500, 100, 0.0)[0] for i in range(4)]
    assert [o.outcome for o in outs] == [Outcome.QUEUE] * 3 + [Outcome.REJECT]
    assert outs[3].reason is ReasonCode.TENANT_QUEUE_FULL
    assert outs[3].retry_after_s is not None and outs[3].retry_after_s > 0


def test_pool_queue_bound() -> None:
    core = _full_core()
    for i in range(3):
        core.submit(f"a{i}", "a", "m8", 500, 100, 0.0)
    outs = [core.submit(f"b{i}", "b", "m8", 500, 100, 0.0)[0] for i in range(3)]
    assert [o.outcome for o in outs] == [Outcome.QUEUE, Outcome.QUEUE, Outcome.REJECT]
    assert outs[2].reason is ReasonCode.QUEUE_FULL
    assert len(core.dispatchers["p"].queue) == 5


def test_queued_request_times_out_with_a_hint_when_nothing_frees() -> None:
    core = _full_core()
    q = core.submit("a1", "a", "m8", 500, 100, 0.0)[0]
    assert q.outcome is Outcome.QUEUE
    assert core.tick(0.99) == []
    (t,) = core.tick(1.0)
    assert t.outcome is Outcome.TIMEOUT and t.request_id == "a1"
    assert t.reason is ReasonCode.QUEUE_TIMEOUT
    assert t.retry_after_s is not None and t.retry_after_s > 0
    assert t.queue_wait_s == 1.0


def test_queued_request_dispatches_when_memory_frees() -> None:
    core = _full_core()
    core.submit("a1", "a", "m8", 500, 100, 0.0)
    out = core.complete(pool="p", request_id="big", attempt=0, ok=True, output_tokens=50,
                        prefill_s=0.1, decode_s=0.4, concurrency=1.0, now=0.5)
    assert [(d.request_id, d.outcome) for d in out] == [
        ("big", Outcome.COMPLETE), ("a1", Outcome.ACCEPT)
    ]
    assert out[1].reason is ReasonCode.DISPATCHED_FROM_QUEUE and out[1].queue_wait_s == 0.5


def test_deadline_unreachable_leaves_early() -> None:
    cfg = config(tenants=[tenant("a", queue_max=3, max_queue_wait_ms=60_000, sla_ms=3000)],
                 gpus=1, kv_budget_gib=0.1)
    core = AdmissionCore(cfg)
    core.submit("big", "a", "m8", 600, 100, 0.0)
    q = core.submit("q", "a", "m8", 500, 100, 0.0)[0]
    assert q.outcome is Outcome.QUEUE
    p = core.dispatchers["p"].queue.members["q"]
    assert p.expires_at < 3.0  # must start by deadline - predicted time
    out = core.tick(p.expires_at)
    assert out[0].reason is ReasonCode.DEADLINE_UNREACHABLE


# --- fair lanes with deadlines blended in (policy.deadline_s_per_token) -------------------

def _lanes(blend: float, service_a: float) -> list[str]:
    """Order in which a fair queue hands out two lanes: tenant `a` (`service_a` weighted
    tokens served, a 5 s deadline) and tenant `b` (nothing served, a 100 s deadline)."""
    from triage.admission.pending import Pending
    from triage.admission.queue import PoolQueue

    q = PoolQueue(max_size=10, tenant_limits={}, deadline_s_per_token=blend)
    services = {"a": service_a, "b": 0.0}
    for i, (t, sla) in enumerate((("a", 5.0), ("b", 100.0))):
        p = Pending(f"{t}1", t, "m8", "p", 100, 10, 0.0, sla)
        p.seq = i + 1
        q.push(p, services[t], 0.1)
    order = []
    while (p := q.head_request()) is not None:
        order.append(p.tenant)
        q.remove(p, services[p.tenant], 0.1)
    return order


def test_a_tight_deadline_goes_first_when_services_are_close() -> None:
    """Pure virtual-service order (VTC, blend 0) serves the tenant that is 1,000 tokens
    behind first, though its deadline is 95 s later; the full policy's blend (1,000
    tokens = 3 ms) serves the tight deadline first."""
    assert _lanes(0.0, 1_000.0) == ["b", "a"]
    assert _lanes(3e-6, 1_000.0) == ["a", "b"]


def test_a_tenant_far_ahead_still_waits() -> None:
    """Fairness holds: 100M weighted tokens ahead outweigh a 95 s deadline gap."""
    assert _lanes(3e-6, 1e8) == ["b", "a"]


def test_the_full_policy_blends_deadlines_and_the_baselines_do_not() -> None:
    from triage.admission.policy import resolve_policy
    from triage.config.models import PolicyConfig, PolicyPreset

    assert resolve_policy(PolicyConfig()).deadline_s_per_token == 3e-6
    assert resolve_policy(PolicyConfig(preset=PolicyPreset.VTC)).deadline_s_per_token == 0.0
    assert resolve_policy(PolicyConfig(deadline_s_per_token=0.0)).deadline_s_per_token == 0.0
