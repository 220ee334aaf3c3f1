"""Completions a few to a message: the wire form (one Completion or a CompletionBatch),
the worker's batcher (linger, size cap, one future per completion) and the admission
service reading a batch (each item on its own: one that fails does not sink the rest)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from _core_factory import config, tenant
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import ListOutbox
from triage.streams.service import AdmissionService
from triage.streams.store import MappingStore
from triage.topics.messages import (
    Completion,
    CompletionBatch,
    CompletionStatus,
    DeadLetter,
    InferenceRequest,
    Message,
    Reply,
    completions_in,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import ReplyStatus
from triage.workers.batching import CompletionBatcher
from triage.workers.publish import DeliveryError

NAMES = TopicNames("t")


def _done(rid: str, pool: str = "p", text: str | None = None) -> Completion:
    return Completion(request_id=rid, tenant="a", model="m8", pool=pool, gpu_id="g0",
                      gpu_type="g", status=CompletionStatus.COMPLETED, prompt_tokens=500,
                      output_tokens=42, max_tokens=100, prefill_s=0.01, decode_s=0.5,
                      started_at_ms=1000, finished_at_ms=1600, text=text)  # fmt: skip


# ---------------------------------------------------------------- the wire form

def test_a_message_carries_one_completion_or_a_batch() -> None:
    one, two = _done("r1"), _done("r2")
    assert completions_in(one.to_bytes()) == [one]
    assert completions_in(CompletionBatch(completions=[one, two]).to_bytes()) == [one, two]


def test_a_lone_completion_whose_text_names_the_batch_field_is_still_one() -> None:
    odd = _done("r1", text='{"completions": []} and "completions"')
    assert completions_in(odd.to_bytes()) == [odd]


def test_a_broken_batch_is_refused_naming_the_field() -> None:
    bad = _done("r2").to_bytes().replace(b'"output_tokens":42', b'"output_tokens":-1')
    raw = b'{"completions":[%s,%s]}' % (_done("r1").to_bytes(), bad)
    with pytest.raises(ValidationError, match=r"completions\.1\.output_tokens"):
        completions_in(raw)
    with pytest.raises(ValidationError, match="one pool"):
        CompletionBatch(completions=[_done("r1", "p"), _done("r2", "q")])
    with pytest.raises(ValidationError, match="at least 1"):
        completions_in(b'{"completions": []}')


# ---------------------------------------------------------------- the batcher

class _Producer:
    """What the batcher needs of AsyncProducer: send returns a delivery future."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sent: list[tuple[str, Message, asyncio.Future[None]]] = []
        self.counted = 0  # the batcher's on_message calls

    def send(self, topic: str, key: str, message: Message,
             partition: int = -1) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self.loop.create_future()
        self.sent.append((key, message, fut))
        return fut


def _batcher(max_items: int, linger_s: float) -> tuple[CompletionBatcher, _Producer]:
    loop = asyncio.get_running_loop()
    producer = _Producer(loop)
    b = CompletionBatcher(producer, "t.completions", loop,  # type: ignore[arg-type]
                          max_items=max_items, linger_s=linger_s,
                          on_message=lambda: setattr(producer, "counted", producer.counted + 1))
    return b, producer


def test_completions_that_finish_together_share_a_message_per_pool() -> None:
    async def go() -> None:
        b, producer = _batcher(max_items=10, linger_s=0.01)
        futs = [b.send("p", _done(f"r{i}")) for i in range(3)] + [b.send("q", _done("x", "q"))]
        assert producer.sent == []  # lingering
        await asyncio.sleep(0.05)
        by_key = {k: m for k, m, _ in producer.sent}
        assert isinstance(by_key["p"], CompletionBatch) and len(by_key["p"].completions) == 3
        assert isinstance(by_key["q"], Completion)  # alone: sent plain
        assert not any(f.done() for f in futs)  # not acknowledged yet
        for _, _, delivery in producer.sent:
            delivery.set_result(None)
        await asyncio.sleep(0)
        assert all(f.done() and f.exception() is None for f in futs)
    asyncio.run(go())


def test_a_full_batch_goes_at_once_and_a_failed_delivery_fails_each_of_its_items() -> None:
    async def go() -> None:
        b, producer = _batcher(max_items=2, linger_s=60.0)
        futs = [b.send("p", _done(f"r{i}")) for i in range(5)]
        assert [len(m.completions) for _, m, _ in producer.sent
                if isinstance(m, CompletionBatch)] == [2, 2]  # the fifth lingers
        b.flush()
        assert len(producer.sent) == 3 and producer.counted == 3
        producer.sent[0][2].set_exception(DeliveryError("broker gone"))
        for _, _, d in producer.sent[1:]:
            d.set_result(None)
        await asyncio.sleep(0)
        assert [type(f.exception()).__name__ if f.exception() else None for f in futs] == \
            ["DeliveryError", "DeliveryError", None, None, None]
    asyncio.run(go())


def test_batch_of_one_sends_each_completion_alone_at_once() -> None:
    async def go() -> None:
        b, producer = _batcher(max_items=1, linger_s=60.0)
        b.send("p", _done("r1"))
        b.send("p", _done("r2"))
        assert [type(m) for _, m, _ in producer.sent] == [Completion, Completion]
    asyncio.run(go())


# ---------------------------------------------------------------- the admission service

def _service() -> tuple[AdmissionService, ListOutbox]:
    cfg = config(tenants=[tenant("a")], gpus=1, kv_budget_gib=0.2)
    out = ListOutbox()
    svc = AdmissionService(cfg, names=NAMES, outbox=out, store=MappingStore.in_memory(),
                           metrics=AdmissionMetrics(CollectorRegistry()), expect_heartbeats=False)
    svc.restore(0.0)
    for rid in ("r1", "r2"):
        req = InferenceRequest(request_id=rid, tenant="a", model="m8", prompt_tokens=200,
                               max_tokens=100, prompt="hello")
        svc.on_request(topic="t.requests.a", key=b"k", value=req.to_bytes(), partition=0,
                       offset=0, now=1.0)
    return svc, out


def _terminal(out: ListOutbox) -> dict[str, ReplyStatus]:
    replies = [Reply.from_bytes(v) for v in out.on("t.replies.a")]
    return {r.request_id: r.status for r in replies if r.status is not ReplyStatus.ACCEPTED}


def test_a_batch_answers_each_of_its_requests() -> None:
    svc, out = _service()
    batch = CompletionBatch(completions=[_done("r1"), _done("r2")])
    svc.on_completion(batch.to_bytes(), partition=0, offset=7, now=1.6)
    assert _terminal(out) == {"r1": ReplyStatus.COMPLETED, "r2": ReplyStatus.COMPLETED}


def test_an_item_whose_handling_fails_is_dead_lettered_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    svc, out = _service()

    class Failing:  # the compiled core's methods cannot be patched: wrap it
        def __init__(self, core: Any) -> None:
            self._core = core

        def __getattr__(self, name: str) -> Any:
            return getattr(self._core, name)

        def complete(self, **kw: Any) -> Any:
            if kw["request_id"] == "r1":
                raise RuntimeError("boom")
            return self._core.complete(**kw)

    monkeypatch.setattr(svc, "core", Failing(svc.core))
    batch = CompletionBatch(completions=[_done("r1"), _done("r2")])
    svc.on_completion(batch.to_bytes(), partition=0, offset=7, now=1.6)
    assert _terminal(out) == {"r2": ReplyStatus.COMPLETED}
    (dl,) = [DeadLetter.from_bytes(v) for v in out.on("t.deadletter")]
    assert "boom" in dl.error and dl.offset == 7
    assert completions_in(base64.b64decode(dl.value_b64)) == [_done("r1")]  # not the batch


def test_a_malformed_batch_is_dead_lettered_with_the_reason() -> None:
    svc, out = _service()
    svc.on_completion(b'{"completions": [{"request_id": "r1"}]}', partition=0, offset=3, now=2.0)
    (dl,) = [DeadLetter.from_bytes(v) for v in out.on("t.deadletter")]
    assert "completions.0" in dl.error and _terminal(out) == {}
