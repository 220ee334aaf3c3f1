"""Crash safety of the admission service, by construction: a kill -9 can fall between
any table write and the commit of the outputs it caused. Here a "crash" throws away the
process (service and outbox) and keeps the store (the changelog, flushed before every
output batch commits); recovery must publish exactly what the lost batches held.

The Faust-level version of the same scenarios runs in tests/faults/ on the real broker."""

from __future__ import annotations

from _core_factory import config, tenant
from prometheus_client import CollectorRegistry

from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import ListOutbox
from triage.streams.service import AdmissionService
from triage.streams.store import MappingStore
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    DecisionRecord,
    InferenceRequest,
    LiveState,
    Reply,
    WorkItem,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import ReplyStatus

NAMES = TopicNames("t")
REPLIES = "t.replies.a"


def _boot(store: MappingStore, committed: int = 0, **tkw: object
          ) -> tuple[AdmissionService, ListOutbox]:
    """A process starting over `store`, after batches up to `committed` went out."""
    cfg = config(tenants=[tenant("a", **tkw)], gpus=1, kv_budget_gib=0.2)
    out = ListOutbox()
    out.resume_after(committed)
    svc = AdmissionService(cfg, names=NAMES, outbox=out, store=store,
                           metrics=AdmissionMetrics(CollectorRegistry()), expect_heartbeats=False)
    svc.restore(0.0)
    return svc, out


def _req(rid: str, prompt: int = 500, max_tokens: int = 100) -> bytes:
    return InferenceRequest(request_id=rid, tenant="a", model="m8", prompt_tokens=prompt,
                            max_tokens=max_tokens, prompt="hello").to_bytes()


def _send(svc: AdmissionService, rid: str, now: float, **kw: int) -> None:
    svc.on_request(topic="t.requests.a", key=rid.encode(), value=_req(rid, **kw), partition=0,
                   offset=0, now=now)


def _complete(svc: AdmissionService, rid: str, now: float) -> None:
    c = Completion(request_id=rid, attempt=0, tenant="a", model="m8", pool="p", gpu_id="g0",
                   gpu_type="g", status=CompletionStatus.COMPLETED, prompt_tokens=500,
                   output_tokens=42, max_tokens=100, prefill_s=0.01, decode_s=0.5,
                   started_at_ms=1000, finished_at_ms=1600, text="the answer")
    svc.on_completion(c.to_bytes(), now=now)


def _published(out: ListOutbox, topic: str) -> list[bytes]:
    return [v for t, _, v in out.published if t == topic]


def test_completion_whose_reply_batch_was_lost_is_answered_on_recovery() -> None:
    """Issue 12: 'state marked DONE but its completed reply and decision never published'."""
    store = MappingStore.in_memory()
    svc, out = _boot(store)
    _send(svc, "r1", 1.0)
    committed = out.commit()
    _complete(svc, "r1", 2.0)  # DONE is in the store; its outputs are only staged
    assert store.get_request("r1").state is LiveState.DONE  # type: ignore[union-attr]
    # kill -9: the staged batch never committed
    _, out2 = _boot(store, committed)
    out2.commit()
    (reply,) = [Reply.from_bytes(v) for v in _published(out2, REPLIES)]
    assert reply.status is ReplyStatus.COMPLETED and reply.text == "the answer"
    (rec,) = [DecisionRecord.from_bytes(v) for v in _published(out2, "t.decisions")]
    assert rec.request_id == "r1" and rec.outcome.value == "complete"


def test_accepted_request_whose_work_item_was_lost_is_dispatched_on_recovery() -> None:
    """Issue 12: 'stranded running: accept published, WorkItem never sent'."""
    store = MappingStore.in_memory()
    svc, out = _boot(store)
    _send(svc, "r1", 1.0)
    assert store.get_request("r1").state is LiveState.RUNNING  # type: ignore[union-attr]
    _, out2 = _boot(store, out.confirmed)  # crash before the batch committed
    out2.commit()
    (item,) = [WorkItem.from_bytes(v) for v in _published(out2, "t.gpu.g0.work")]
    assert item.request_id == "r1" and item.prompt == "hello"
    assert [Reply.from_bytes(v).status for v in _published(out2, REPLIES)] == [
        ReplyStatus.ACCEPTED]


def test_committed_batches_are_not_sent_again() -> None:
    store = MappingStore.in_memory()
    svc, out = _boot(store)
    for i in range(5):
        _send(svc, f"r{i}", 1.0 + i)
    _complete(svc, "r0", 7.0)
    committed = out.commit()
    _, out2 = _boot(store, committed)
    assert out2.replayed == 0 and out2.staged() == 0


def test_a_record_rewritten_in_later_batches_carries_every_uncommitted_output() -> None:
    """Queued in batch 1, dispatched in batch 2; neither committed: both replies replay."""
    store = MappingStore.in_memory()
    svc, out = _boot(store, max_queue_wait_ms=60_000)
    _send(svc, "r0", 1.0, prompt=1000, max_tokens=100)  # fills the GPU's KV
    _send(svc, "r1", 1.0, prompt=600, max_tokens=100)  # waits
    out.seal()  # batch 1 sealed, its transaction never committed
    _complete(svc, "r0", 2.0)
    svc.on_tick(2.1)  # r1 dispatched in batch 2
    _, out2 = _boot(store, 0, max_queue_wait_ms=60_000)
    out2.commit()
    statuses = [Reply.from_bytes(v).status for v in _published(out2, REPLIES)
                if Reply.from_bytes(v).request_id == "r1"]
    assert ReplyStatus.ACCEPTED in statuses and statuses[0] is ReplyStatus.QUEUED
    assert [WorkItem.from_bytes(v).request_id for v in _published(out2, "t.gpu.g0.work")
            ].count("r1") == 1


def test_bucket_consumption_survives_a_crash_before_any_tick() -> None:
    """Issue 12 item 5: no fresh burst after kill -9. The bucket table is written on ticks;
    the record of the decision that drained the bucket carries it too."""
    store = MappingStore.in_memory()
    kw = {"rate_tokens_per_s": 1.0, "burst_tokens": 2000.0, "output_ratio_prior": 1.0}
    svc, out = _boot(store, **kw)
    svc.on_tick(0.5)  # bucket table holds the full bucket
    _send(svc, "r1", 1.0, prompt=1000, max_tokens=100)
    level = svc.core.gate.bucket("a").level
    assert level < 2000.0 - 1000
    svc2, _ = _boot(store, out.confirmed, **kw)
    assert abs(svc2.core.gate.bucket("a").level - level) < 1e-6


def test_replayed_outputs_survive_a_second_crash_before_they_commit() -> None:
    store = MappingStore.in_memory()
    svc, _out = _boot(store)
    _send(svc, "r1", 1.0)
    _, out2 = _boot(store, 0)  # crash 1: replay staged
    assert out2.replayed > 0
    _, out3 = _boot(store, 0)  # crash 2 before the replay committed
    out3.commit()
    assert len(_published(out3, "t.gpu.g0.work")) == 1


def test_any_record_write_carries_the_outputs_of_its_id() -> None:
    """Whoever writes a record (a refusal, a withdrawal), it carries its id's outputs."""
    store = MappingStore.in_memory()
    svc, out = _boot(store)
    out.send_raw(REPLIES, b"x1", b'{"request_id":"x1"}')
    raw = store.get_request_raw("r0")
    assert raw is None
    _send(svc, "r0", 1.0)
    rec = store.get_request_raw("r0")
    assert rec is not None
    store.put_request_raw("x1", rec.replace(b'"r0"', b'"x1"'))
    (_, env), = [(k, e) for k, e in store.envelopes() if k == "x1"]
    assert [(t, v) for _, t, v in env.outputs] == [(REPLIES, b'{"request_id":"x1"}')]
    out.commit()
    store.put_request_raw("x1", rec.replace(b'"r0"', b'"x1"'))
    (_, env), = [(k, e) for k, e in store.envelopes() if k == "x1"]
    assert env.outputs == []  # committed: nothing left to carry
