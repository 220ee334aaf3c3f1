"""The admission service over a dict store and a list outbox: the shell's glue without
Kafka (the same handlers run under Faust in tests/integration/test_admission_app.py)."""

from __future__ import annotations

import json

from _core_factory import config, tenant
from prometheus_client import CollectorRegistry

from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import ListOutbox
from triage.streams.service import AdmissionService
from triage.streams.store import MappingStore
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    DeadLetter,
    DecisionRecord,
    InferenceRequest,
    LiveState,
    Reply,
    WorkItem,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode, ReplyStatus

NAMES = TopicNames("t")


Built = tuple[AdmissionService, ListOutbox, MappingStore]


def _service(store: MappingStore | None = None, **tkw: object) -> Built:
    cfg = config(tenants=[tenant("a", **tkw)], gpus=1, kv_budget_gib=0.2)
    out = ListOutbox()
    st = store or MappingStore.in_memory()
    svc = AdmissionService(cfg, names=NAMES, outbox=out, store=st,
                           metrics=AdmissionMetrics(CollectorRegistry()), expect_heartbeats=False)
    svc.restore(0.0)
    return svc, out, st


def _req(rid: str, prompt: int = 500, max_tokens: int = 100, **kw: object) -> bytes:
    return InferenceRequest(request_id=rid, tenant="a", model="m8", prompt_tokens=prompt,
                            max_tokens=max_tokens, prompt="hello", **kw).to_bytes()  # type: ignore[arg-type]


def _send(svc: AdmissionService, value: bytes, now: float, topic: str = "t.requests.a") -> None:
    svc.on_request(topic=topic, key=b"k", value=value, partition=0, offset=0, now=now)


def _replies(out: ListOutbox) -> list[Reply]:
    return [Reply.from_bytes(v) for v in out.on("t.replies.a")]


def test_accepted_request_gets_a_work_item_a_reply_and_a_decision() -> None:
    svc, out, store = _service()
    _send(svc, _req("r1"), 1.0)
    (item,) = [WorkItem.from_bytes(v) for v in out.on("t.gpu.g0.work")]
    assert item.request_id == "r1" and item.prompt == "hello" and item.attempt == 0
    assert [r.status for r in _replies(out)] == [ReplyStatus.ACCEPTED]
    (rec,) = [DecisionRecord.from_bytes(v) for v in out.on("t.decisions")]
    assert rec.outcome.value == "accept" and rec.policy == "full"
    live = store.get_request("r1")
    assert live is not None and live.state is LiveState.RUNNING and live.gpu_id == "g0"


def test_completion_sends_the_terminal_reply_with_the_text() -> None:
    svc, out, store = _service()
    _send(svc, _req("r1"), 1.0)
    c = Completion(request_id="r1", attempt=0, tenant="a", model="m8", pool="p", gpu_id="g0",
                   gpu_type="g", status=CompletionStatus.COMPLETED, prompt_tokens=500,
                   output_tokens=42, max_tokens=100, prefill_s=0.01, decode_s=0.5,
                   started_at_ms=1000, finished_at_ms=1600, text="the answer")
    svc.on_completion(c.to_bytes(), now=1.6)
    last = _replies(out)[-1]
    assert last.status is ReplyStatus.COMPLETED and last.text == "the answer"
    assert last.output_tokens == 42 and last.latency_ms is not None and last.latency_ms > 500
    rec = store.get_request("r1")
    assert rec is not None and rec.state is LiveState.DONE and rec.last_reply == last


def test_unparseable_bytes_go_to_the_dead_letter_topic() -> None:
    svc, out, _ = _service()
    _send(svc, b"{not json", 1.0)
    (dl,) = [DeadLetter.from_bytes(v) for v in out.on("t.deadletter")]
    assert "not JSON" in dl.error and dl.source_topic == "t.requests.a"
    assert _replies(out) == []


def test_invalid_request_is_answered_with_the_reason() -> None:
    svc, out, _ = _service()
    bad = json.dumps({"request_id": "r9", "tenant": "a", "model": "m8", "prompt_tokens": -4,
                      "max_tokens": 10}).encode()
    _send(svc, bad, 1.0)
    (reply,) = _replies(out)
    assert reply.status is ReplyStatus.INVALID and reply.reason is ReasonCode.INVALID_REQUEST
    assert reply.detail is not None and "prompt_tokens" in reply.detail
    assert out.on("t.deadletter")


def test_payload_tenant_must_match_the_topic() -> None:
    svc, out, _ = _service()
    _send(svc, _req("r1"), 1.0, topic="t.requests.b")
    assert out.on("t.replies.b")  # answered on the topic's tenant's reply topic
    reply = Reply.from_bytes(out.on("t.replies.b")[0])
    assert reply.reason is ReasonCode.TENANT_MISMATCH


def test_redelivered_request_gets_its_recorded_reply_not_a_second_dispatch() -> None:
    svc, out, _ = _service()
    _send(svc, _req("r1"), 1.0)
    _send(svc, _req("r1"), 1.1)
    assert len(out.on("t.gpu.g0.work")) == 1
    assert [r.status for r in _replies(out)] == [ReplyStatus.ACCEPTED, ReplyStatus.ACCEPTED]


def test_restart_recovers_buckets_queue_and_ledger_from_the_store() -> None:
    svc, _out, store = _service(rate_tokens_per_s=10.0, burst_tokens=2000.0,
                                output_ratio_prior=1.0, max_queue_wait_ms=60_000)
    _send(svc, _req("r1", prompt=1000, max_tokens=100), 1.0)  # fills the GPU's KV
    _send(svc, _req("r2", prompt=600, max_tokens=100), 1.0)  # waits
    svc.on_tick(1.1)  # writes the bucket behind
    level = svc.core.gate.bucket("a").level
    assert level < 2000.0 - 1000
    # a new process over the same store
    svc2, _, _ = _service(store=store, rate_tokens_per_s=10.0, burst_tokens=2000.0,
                          output_ratio_prior=1.0, max_queue_wait_ms=60_000)
    assert svc2.core.gate.bucket("a").level == level  # no fresh burst
    d = svc2.core.dispatchers["p"]
    assert "r1" in d.inflight and "r2" in d.queue.members
    assert d.ledger.slot("g0").used == d.inflight["r1"].kv_bytes


def test_tick_times_out_a_queued_request_with_a_hint() -> None:
    svc, out, store = _service(max_queue_wait_ms=500)
    _send(svc, _req("r1", prompt=1200, max_tokens=100), 1.0)
    _send(svc, _req("r2", prompt=600, max_tokens=100), 1.0)
    svc.on_tick(1.6)
    last = _replies(out)[-1]
    assert last.request_id == "r2" and last.status is ReplyStatus.TIMED_OUT
    assert last.retry_after_ms is not None and last.retry_after_ms > 0
    rec = store.get_request("r2")
    assert rec is not None and rec.state is LiveState.DONE


def test_gauges_sample_the_core_once_a_second_not_every_tick() -> None:
    """Ticks come every 50 ms; the gauges (per-tenant queue depths, KV, tightening) are
    set on the first and then once per GAUGES_EVERY_S of the clock the ticks carry."""
    from triage.streams.service import GAUGES_EVERY_S

    svc, _out, _st = _service()
    sampled: list[float] = []
    observe = svc._observe_gauges
    svc._observe_gauges = lambda: (sampled.append(now), observe())[1]  # type: ignore[method-assign]
    for i in range(41):  # 2 s of ticks
        now = 100.0 + i * 0.05
        svc.on_tick(now)
    assert GAUGES_EVERY_S == 1.0
    assert [round(t, 2) for t in sampled] == [100.0, 101.0, 102.0]


def test_a_runner_stopped_past_its_deadline_gets_one_timeout_reply_and_a_cancel() -> None:
    """`policy.cancel_late` through the shell: the terminal reply, the control that stops
    the attempt on its GPU, the done record; the worker's report of the stopped attempt
    afterwards sends nothing more."""
    from triage.topics.messages import ControlKind, ControlMessage

    svc, out, store = _service(sla_ms=5_000, max_queue_wait_ms=30_000)
    _send(svc, _req("r1", prompt=100, max_tokens=100), 1.0)
    assert [r.status for r in _replies(out)] == [ReplyStatus.ACCEPTED]
    svc.core.dispatchers["p"].monitor.tightened = True
    svc.on_tick(3.0)  # not yet past its deadline (6 s)
    assert [r.status for r in _replies(out)] == [ReplyStatus.ACCEPTED]
    svc.on_tick(20.0)
    replies = _replies(out)
    assert [r.status for r in replies] == [ReplyStatus.ACCEPTED, ReplyStatus.TIMED_OUT]
    assert replies[-1].reason is ReasonCode.DEADLINE_UNREACHABLE
    (control,) = [ControlMessage.from_bytes(v) for v in out.on(NAMES.gpu_control("g0"))]
    assert (control.kind, control.request_id, control.attempt) == (ControlKind.CANCEL, "r1", 0)
    rec = store.get_request("r1")
    assert rec is not None and rec.state is LiveState.DONE
    c = Completion(request_id="r1", attempt=0, tenant="a", model="m8", pool="p", gpu_id="g0",
                   gpu_type="g", status=CompletionStatus.CANCELLED, prompt_tokens=100,
                   output_tokens=60, max_tokens=100, prefill_s=0.01, decode_s=18.0,
                   started_at_ms=1000, finished_at_ms=20_100)
    svc.on_completion(c.to_bytes(), now=20.1)
    assert len(_replies(out)) == 2
