"""Preemption: the rule exactly as stated, and what it does to the preempted request."""

from __future__ import annotations

import pytest
from _core_factory import config, tenant
from hypothesis import given
from hypothesis import strategies as st

from triage.admission.core import AdmissionCore
from triage.admission.preemption import outranks, should_preempt
from triage.topics.reasons import Outcome, ReasonCode


@given(
    q_cls=st.integers(0, 1), r_cls=st.integers(0, 1), q_srv=st.floats(0, 1e6),
    r_srv=st.floats(0, 1e6), same=st.booleans(), slack=st.floats(0, 100),
    remaining=st.floats(0, 100), factor=st.floats(0.01, 1.0),
)
def test_rule_exactly_as_stated(
    q_cls: int, r_cls: int, q_srv: float, r_srv: float, same: bool, slack: float,
    remaining: float, factor: float,
) -> None:
    higher = (not same) and (q_cls < r_cls or (q_cls == r_cls and q_srv < r_srv))
    assert outranks((q_cls, q_srv), (r_cls, r_srv), same) == higher
    expected = higher and slack < factor * remaining
    assert should_preempt(
        queued_outranks=higher, queued_slack_s=slack, runner_remaining_s=remaining,
        factor=factor,
    ) == expected


def _core() -> AdmissionCore:
    cfg = config(
        tenants=[
            tenant("batch", sla_ms=600_000, max_queue_wait_ms=600_000, weight=1.0),
            tenant("chat", sla_ms=5_000, max_queue_wait_ms=5_000, weight=4.0),
        ],
        gpus=1, kv_budget_gib=0.7,
    )
    return AdmissionCore(cfg)


def test_tight_higher_priority_request_preempts_a_long_runner() -> None:
    core = _core()
    # batch has been served (high weighted service); its long job fills the GPU
    long_job = core.submit("long", "batch", "m8", 300, 5000, 0.0)[0]
    assert long_job.outcome is Outcome.ACCEPT
    d = core.dispatchers["p"]
    remaining = d.inflight["long"].predicted_end - 1.0
    out = core.submit("chat1", "chat", "m8", 300, 200, 1.0)
    assert out[0].outcome is Outcome.QUEUE
    out = core.tick(1.05)
    kinds = [(x.request_id, x.outcome) for x in out]
    assert ("long", Outcome.PREEMPT) in kinds and ("chat1", Outcome.ACCEPT) in kinds
    pre = next(x for x in out if x.outcome is Outcome.PREEMPT)
    assert pre.reason is ReasonCode.PREEMPTED_FOR_PRIORITY and pre.attempt == 0
    assert pre.recompute_tokens is not None and pre.recompute_tokens >= 300
    assert 0.5 * remaining > 5.0 - 0.05  # the rule held: slack under half the remaining
    requeued = d.queue.members["long"]
    assert requeued.attempt == 1
    assert d.stats.preemptions == 1 and d.stats.preemption_rate > 0


def test_no_preemption_when_the_runner_is_nearly_done() -> None:
    core = _core()
    core.submit("long", "batch", "m8", 300, 5000, 0.0)
    d = core.dispatchers["p"]
    end = d.inflight["long"].predicted_end
    core.submit("chat1", "chat", "m8", 300, 200, end - 6.0)
    out = core.tick(end - 5.9)  # chat slack ~5 s is not under half of ~5.9 s remaining
    assert all(x.outcome is not Outcome.PREEMPT for x in out)


def test_no_preemption_for_the_same_tenant() -> None:
    core = _core()
    core.submit("long", "chat", "m8", 300, 5000, 0.0)
    core.submit("chat2", "chat", "m8", 300, 200, 0.5)
    out = core.tick(0.6)
    assert all(x.outcome is not Outcome.PREEMPT for x in out)


def test_completion_of_a_preempted_attempt_that_finished_anyway_counts_once() -> None:
    core = _core()
    core.submit("long", "batch", "m8", 300, 5000, 0.0)
    core.submit("chat1", "chat", "m8", 300, 200, 1.0)
    core.tick(1.05)  # long preempted, requeued as attempt 1
    out = core.complete(pool="p", request_id="long", attempt=0, ok=True, output_tokens=500,
                        prefill_s=0.01, decode_s=1.0, concurrency=1.0, now=1.1)
    done = [x for x in out if x.request_id == "long"]
    assert len(done) == 1 and done[0].outcome is Outcome.COMPLETE
    assert "long" not in core.dispatchers["p"].queue.members
    again = core.complete(pool="p", request_id="long", attempt=0, ok=True, output_tokens=500,
                          prefill_s=0.01, decode_s=1.0, concurrency=1.0, now=1.2)
    assert [x for x in again if x.request_id == "long"] == []


def test_preemption_disabled_by_policy() -> None:
    cfg = config(
        tenants=[tenant("batch", sla_ms=600_000, max_queue_wait_ms=600_000),
                 tenant("chat", sla_ms=5_000, max_queue_wait_ms=5_000, weight=4.0)],
        gpus=1, kv_budget_gib=0.7, policy={"preset": "full", "preemption": False},
    )
    core = AdmissionCore(cfg)
    core.submit("long", "batch", "m8", 300, 5000, 0.0)
    core.submit("chat1", "chat", "m8", 300, 200, 1.0)
    assert all(x.outcome is not Outcome.PREEMPT for x in core.tick(1.05))


@pytest.mark.timeout(60, method="thread")  # the old code looped for ever inside one tick
def test_two_tenants_never_preempt_each_other_in_turn_without_the_sla_check() -> None:
    """With `sla_fit: false`, each dispatch charged the starter's tenant, so the fair keys
    of two tenants swapped with every start: a's request preempted b's, then b's (requeued,
    now the less-served tenant) preempted a's, and so on at one `now`, each round
    appending decisions until the process ran out of memory. A preemption now pays only
    for a request predicted to meet its deadline, and never stops a runner started at
    the same instant."""
    cfg = config(
        tenants=[tenant("a", sla_ms=600_000, max_queue_wait_ms=600_000),
                 tenant("b", sla_ms=600_000, max_queue_wait_ms=600_000)],
        gpus=1, kv_budget_gib=0.7, policy={"preset": "full", "sla_fit": False},
    )
    core = AdmissionCore(cfg)
    core.submit("b1", "b", "m8", 300, 5000, 0.0)
    core.submit("a1", "a", "m8", 400, 5000, 0.5, sla_s=8.0)
    core.submit("b2", "b", "m8", 300, 5000, 0.6, sla_s=8.0)
    out = core.tick(1.0)
    # neither 8 s request could finish its ~35 s of predicted work in time, so stopping
    # the runner would pay nothing: no preemption at all (the old code made 76 here)
    assert [x for x in out if x.outcome is Outcome.PREEMPT] == []
    d = core.dispatchers["p"]
    assert d.stats.preemptions == 0
    assert list(d.inflight) == ["b1"]  # the runner keeps the GPU; the others wait
