"""Outgoing messages are built without validation for speed: prove each one validates."""

from __future__ import annotations

from _core_factory import config, tenant

from triage.admission.core import AdmissionCore
from triage.streams import codec
from triage.topics.messages import (
    ControlMessage,
    DecisionRecord,
    LiveRequest,
    LiveState,
    Reply,
    ScaleSignal,
    WorkItem,
)
from triage.topics.reasons import Outcome, ReasonCode


def test_every_builder_round_trips_through_the_strict_parser() -> None:
    cfg = config(tenants=[tenant("a", sla_ms=600_000, max_queue_wait_ms=600_000),
                          tenant("b", sla_ms=5_000, weight=4.0, rate_tokens_per_s=10.0,
                                 burst_tokens=100.0)],
                 gpus=1, kv_budget_gib=0.7, hysteresis={"low": 0.01, "high": 0.02, "hold_s": 0.1},
                 policy={"preset": "full", "overage_when_idle": False})
    core = AdmissionCore(cfg)
    seen = []
    seen += core.submit("long", "a", "m8", 300, 5000, 0.0)
    seen += core.submit("b1", "b", "m8", 300, 200, 1.0)  # over quota: rejected with a hint
    seen += core.submit("b2", "a", "m8", 300, 200, 1.0)  # queued
    seen += core.tick(1.05)
    seen += core.complete(pool="p", request_id="long", attempt=0, ok=True, output_tokens=9,
                          prefill_s=0.1, decode_s=0.2, concurrency=1.0, now=2.0)
    outcomes = {d.outcome for d in seen}
    assert {Outcome.ACCEPT, Outcome.REJECT, Outcome.QUEUE, Outcome.COMPLETE} <= outcomes
    d = core.dispatchers["p"]
    for dec in seen:
        rec = DecisionRecord.from_bytes(codec.decision_record(dec))
        assert (rec.request_id, rec.outcome, rec.reason) == (dec.request_id, dec.outcome,
                                                             dec.reason)
        reply = Reply.from_bytes(codec.reply_bytes(codec.reply_for(dec, text="t")))
        assert reply.request_id == dec.request_id
        control = codec.control_for(dec)
        if control is not None:
            assert ControlMessage.from_bytes(control.to_bytes())
        p = d.inflight.get(dec.request_id) or d.queue.members.get(dec.request_id)
        if dec.outcome is Outcome.ACCEPT and p is not None:
            gpu, raw = codec.work_item(dec, p, prompt="x", metadata={"k": "v"})
            item = WorkItem.from_bytes(raw)
            assert (item.gpu_id, item.attempt, item.metadata) == (gpu, p.attempt, {"k": "v"})
        if p is not None:
            done = codec.finished_record(
                codec.live_record(p, LiveState.RUNNING, prompt="x", metadata={},
                                  last_reply=None, now=2.0), codec.reply_for(dec), 4.0)
            assert LiveRequest.from_bytes(done).state is LiveState.DONE
            rec = codec.live_record(p, LiveState.QUEUED, prompt=None, metadata={},
                                    last_reply=codec.reply_for(dec), now=3.0)
            back = LiveRequest.from_bytes(rec)
            q = codec.pending_from(back)
            assert (q.request_id, q.attempt, q.deadline, q.expected_tokens) == (
                p.request_id, p.attempt, p.deadline, p.expected_tokens)
    for e in core.drain_scale_events():
        assert ScaleSignal.from_bytes(codec.scale_signal(e).to_bytes())


def test_every_outcome_has_one_reply_status() -> None:
    from triage.topics.reasons import ReplyStatus, reply_status

    expect = {
        Outcome.ACCEPT: ReplyStatus.ACCEPTED, Outcome.QUEUE: ReplyStatus.QUEUED,
        Outcome.REJECT: ReplyStatus.REJECTED, Outcome.TIMEOUT: ReplyStatus.TIMED_OUT,
        Outcome.PREEMPT: ReplyStatus.PREEMPTED, Outcome.INVALID: ReplyStatus.INVALID,
    }
    for outcome in Outcome:
        if outcome is Outcome.COMPLETE:
            assert reply_status(outcome, ReasonCode.COMPLETED) is ReplyStatus.COMPLETED
            assert reply_status(outcome, ReasonCode.FAILED) is ReplyStatus.FAILED
        else:
            assert reply_status(outcome, ReasonCode.ADMITTED) is expect[outcome]
