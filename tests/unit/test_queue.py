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
