"""A running request whose result never comes, on a GPU whose heartbeats still arrive
(its work item or its result was lost: `result_overdue`), is taken back and run again,
so it still ends in exactly one terminal reply; a long generation is not cut short."""

from __future__ import annotations

from _core_factory import config, tenant

from triage.admission.core import AdmissionCore
from triage.admission.decision import Decision
from triage.topics.reasons import Outcome, ReasonCode

GIB = 1024**3
LIMIT_S = 30.0


def _core(**policy: object) -> AdmissionCore:
    cfg = config(tenants=[tenant("a", sla_ms=600_000)], gpus=2, kv_budget_gib=64.0,
                 policy={"preset": "full", "result_timeout_s": LIMIT_S, **policy})
    return AdmissionCore(cfg, expect_heartbeats=True)


def _run(core: AdmissionCore, start: float, end: float) -> list[Decision]:
    """Heartbeats from both GPUs and ticks, once a second, over [start, end]."""
    out: list[Decision] = []
    t = start
    while t <= end:
        for g in ("g0", "g1"):
            out += core.heartbeat(pool="p", gpu_id=g, gpu_type="g", speed=1.0,
                                  kv_budget=64 * GIB, up=True, now=t)
        out += core.tick(t)
        t += 1.0
    return out


def test_a_request_with_no_result_runs_again_at_its_limit_and_ends_once() -> None:
    core = _core()
    _run(core, 0.0, 1.0)
    first = core.submit("r1", "a", "m8", 100, 50, 1.5)[0]
    assert first.outcome is Outcome.ACCEPT and first.attempt == 0
    assert not [d for d in _run(core, 2.0, 1.5 + LIMIT_S - 0.5) if d.request_id == "r1"]
    later = [d for d in _run(core, 1.5 + LIMIT_S + 0.5, 1.5 + LIMIT_S + 1.5)
             if d.request_id == "r1"]
    assert [(d.outcome, d.reason, d.attempt) for d in later] == [
        (Outcome.PREEMPT, ReasonCode.RESULT_OVERDUE, 0),  # the old attempt is cancelled
        (Outcome.ACCEPT, ReasonCode.DISPATCHED_FROM_QUEUE, 1),
    ]
    assert later[0].gpu_id is not None  # the shell sends its GPU a cancel for attempt 0
    # the old attempt finishes after all: it counts, once, and the new one is cancelled
    done = core.complete(pool="p", request_id="r1", attempt=0, ok=True, output_tokens=50,
                         prefill_s=0.1, decode_s=1.0, concurrency=1.0, now=40.0)
    assert [(d.outcome, d.reason) for d in done if d.request_id == "r1"] == [
        (Outcome.COMPLETE, ReasonCode.COMPLETED)]
    again = core.complete(pool="p", request_id="r1", attempt=1, ok=True, output_tokens=50,
                          prefill_s=0.1, decode_s=1.0, concurrency=1.0, now=41.0)
    assert not [d for d in again if d.request_id == "r1"]
    assert not core.dispatchers["p"].inflight


def test_a_long_generation_is_given_twice_its_whole_length_at_full_concurrency() -> None:
    core = _core()
    _run(core, 0.0, 1.0)
    d = core.dispatchers["p"]
    assert core.submit("long", "a", "m8", 100, 3000, 1.5)[0].outcome is Outcome.ACCEPT
    limit = d._result_limit(d.inflight["long"])
    assert limit > 2 * LIMIT_S  # its max_tokens at 256 sequences take longer than the floor
    assert not [x for x in _run(core, 2.0, 1.5 + limit - 1.0) if x.request_id == "long"]
    late = [x for x in _run(core, 1.5 + limit, 1.5 + limit + 1.5) if x.request_id == "long"]
    assert late and late[0].reason is ReasonCode.RESULT_OVERDUE


def test_the_simulator_core_never_takes_work_back() -> None:
    """Without heartbeats (the simulator), nothing is lost, so nothing is checked."""
    cfg = config(tenants=[tenant("a")], gpus=1, kv_budget_gib=64.0,
                 policy={"preset": "full", "result_timeout_s": LIMIT_S})
    core = AdmissionCore(cfg)
    assert core.submit("r1", "a", "m8", 100, 50, 0.0)[0].outcome is Outcome.ACCEPT
    out = [x for t in range(200) for x in core.tick(float(t))]
    assert not [x for x in out if x.request_id == "r1"]
    assert "r1" in core.dispatchers["p"].inflight


def test_after_a_gap_in_the_app_s_own_ticks_the_wait_for_results_starts_again() -> None:
    """An app that was not running (restarted and recovered its runners, or stalled) may
    not have read results that are there: its own gap does not count against them."""
    core = _core()
    _run(core, 0.0, 1.0)
    assert core.submit("r1", "a", "m8", 100, 50, 1.5)[0].outcome is Outcome.ACCEPT
    resumed = 100.0  # no tick for ~99 s, past the limit
    assert not [d for d in _run(core, resumed, resumed + LIMIT_S - 1.0) if d.request_id == "r1"]
    late = [d for d in _run(core, resumed + LIMIT_S + 1.0, resumed + LIMIT_S + 2.0)
            if d.request_id == "r1"]
    assert late and late[0].reason is ReasonCode.RESULT_OVERDUE
