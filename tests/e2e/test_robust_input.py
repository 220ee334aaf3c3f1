"""Poison input, duplicates and config changes against the running system: the admission
app and a sim worker as processes on the real broker, fed as an outside client would."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from harness import System, fast_config, running

from triage.chaos.poison import Expect, poison_corpus
from triage.kafka.clients import make_admin, make_consumer, make_producer
from triage.topics.messages import DeadLetter, InferenceRequest, Reply
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode, ReplyStatus

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def tenant(name: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": name, "rate_tokens_per_s": 1e9, "burst_tokens": 1e9,
                            "queue_max": 500, "max_queue_wait_ms": 30_000, "sla_ms": 120_000}
    base.update(kw)
    return base


class Tail:
    """Every message of some one-partition topics from their beginning, read as it comes."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.consumer = make_consumer(bootstrap, f"tail-{time.time()}")
        self.consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in topics])
        self.messages: dict[str, list[Any]] = {t: [] for t in topics}

    def poll(self, seconds: float = 0.5) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for msg in self.consumer.consume(num_messages=500, timeout=0.2):
                if msg.error() is None:
                    self.messages[msg.topic()].append(msg)

    def wait(self, cond: Callable[[], bool], timeout_s: float, what: str,
             alive: Callable[[], bool] = lambda: True) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert alive(), f"the admission app exited while waiting for {what}"
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.poll()

    def close(self) -> None:
        self.consumer.close()


def _replies(tail: Tail, topic: str) -> list[Reply]:
    return [Reply.from_bytes(m.value()) for m in tail.messages[topic]]


def _terminals(tail: Tail, topic: str) -> Counter[str]:
    return Counter(r.request_id for r in _replies(tail, topic) if r.terminal)


def _produce_all(bootstrap: str, topic: str, items: list[tuple[bytes, bytes | None]]) -> list[int]:
    """Send in order; the offset of each (large entries travel compressed, as in the issue)."""
    p = make_producer(bootstrap, **{"compression.type": "gzip", "message.max.bytes": 16_000_000,
                                    "linger.ms": 5})
    offsets: list[int] = [-1] * len(items)

    def delivered(i: int) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            assert err is None, f"entry {i} not delivered: {err}"
            offsets[i] = msg.offset()
        return cb

    for i, (key, value) in enumerate(items):
        p.produce(topic, key=key, value=value, on_delivery=delivered(i))
        p.poll(0)
    assert p.flush(60) == 0
    return offsets


def _request(rid: str, t: str, **kw: Any) -> InferenceRequest:
    return InferenceRequest.model_validate({"request_id": rid, "tenant": t, "model": "small",
                                            "prompt_tokens": 50, "max_tokens": 10, **kw})


@pytest.mark.parametrize("tenant_topics", ["per_tenant", "shared"])
def test_the_poison_corpus_is_answered_or_dead_lettered_and_the_app_keeps_serving(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path, tenant_topics: str
) -> None:
    """On a tenant's own topic, and on the one topic every tenant shares (where the
    request names its tenant, and a message that names none is answered as `unknown`)."""
    names = TopicNames.of(topic_names.prefix, tenant_topics)
    cfg = fast_config(kafka_bootstrap, names, tmp_path, gpus=1,
                      tenants=[tenant("a", max_concurrency=1)],
                      kafka={"tenant_topics": tenant_topics})
    entries = list(poison_corpus(tenant="a", model="small", context_tokens=8192))
    replies, dead = names.replies("a"), names.deadletter
    with running(cfg, tmp_path) as system:
        tail = Tail(kafka_bootstrap, [replies, dead])
        try:
            offsets = _produce_all(kafka_bootstrap, names.requests("a"),
                                   [(e.key, e.value) for e in entries])
            answered = {e.key.decode() for e in entries
                        if e.expect in (Expect.INVALID, Expect.SERVED)}
            dead_offsets = {offsets[i] for i, e in enumerate(entries)
                            if e.expect is Expect.DEAD_LETTER}

            def settled() -> bool:
                seen = set(_terminals(tail, replies))
                dl = {DeadLetter.from_bytes(m.value()).offset for m in tail.messages[dead]}
                return answered <= seen and dead_offsets <= dl

            tail.wait(settled, 240, "every entry's answer", alive=system.admission.alive)
            # normal requests after the corpus are still served, to completion
            after = [_request(f"after-{i}", "a") for i in range(10)]
            _produce_all(kafka_bootstrap, names.requests("a"),
                         [(r.request_id.encode(), r.to_bytes()) for r in after])
            tail.wait(lambda: {r.request_id for r in after} <= set(_terminals(tail, replies)),
                      120, "the requests sent after the corpus", alive=system.admission.alive)
            time.sleep(2.0)  # late copies, if any, would come now
            tail.poll(2.0)
            assert system.admission.alive(), system.admission.tail(60)
            log_text = system.admission.log_path.read_text(errors="replace")
        finally:
            tail.close()

    terminals = _terminals(tail, replies)
    final = {r.request_id: r for r in _replies(tail, replies) if r.terminal}
    dead_at = Counter(DeadLetter.from_bytes(m.value()).offset for m in tail.messages[dead])
    for i, e in enumerate(entries):
        rid = e.key.decode(errors="replace")
        if e.expect is Expect.INVALID:
            assert terminals[rid] == 1 and final[rid].status is ReplyStatus.INVALID, e.name
        elif e.expect is Expect.SERVED:
            assert terminals[rid] == 1 and final[rid].status is not ReplyStatus.INVALID, e.name
        elif e.expect is Expect.DEAD_LETTER:
            assert dead_at[offsets[i]] == 1 and terminals[rid] == 0, e.name
        else:
            assert terminals[rid] == 1, e.name
    assert all(final[r.request_id].status is ReplyStatus.COMPLETED for r in after)
    near = [r for r in _replies(tail, replies) if "-prompt-near-limit-" in r.request_id]
    assert any(r.status is ReplyStatus.QUEUED for r in near)  # ~400 KB prompts were queued
    assert max(terminals.values()) == 1  # no id has two terminal replies
    assert "Traceback" not in log_text and "handler failed" not in log_text


def _edit_tenants(system: System, tenants: list[dict[str, Any]]) -> None:
    data = yaml.safe_load(system.cfg_path.read_text())
    data["tenants"] = tenants
    system.cfg_path.write_text(yaml.safe_dump(data))


def test_a_tenant_added_to_the_config_file_is_served_without_a_restart(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    cfg = fast_config(kafka_bootstrap, topic_names, tmp_path, gpus=1, tenants=[tenant("a")])
    names = topic_names
    with running(cfg, tmp_path) as system:
        time.sleep(4.0)  # the reload timer has seen the file once
        _edit_tenants(system, [tenant("a"), tenant("late")])
        deadline = time.monotonic() + 60
        while names.replies("late") not in _topics(kafka_bootstrap):
            assert time.monotonic() < deadline, "the new tenant's topics were not created"
            time.sleep(0.5)
        reqs = [_request(f"late-{i}", "late") for i in range(60)]
        _produce_all(kafka_bootstrap, names.requests("late"),
                     [(r.request_id.encode(), r.to_bytes()) for r in reqs])
        late = Tail(kafka_bootstrap, [names.replies("late")])
        try:
            try:
                late.wait(lambda: len(_terminals(late, names.replies("late"))) == 60, 120,
                          "the new tenant's 60 requests", alive=system.admission.alive)
            except AssertionError as exc:  # say what came and what did not
                seen = _replies(late, names.replies("late"))
                missing = sorted({r.request_id for r in reqs} - set(_terminals(
                    late, names.replies("late"))))
                statuses = Counter(f"{r.status.value}/{r.reason}" for r in seen)
                raise AssertionError(
                    f"{exc}: replies {dict(statuses)}; no terminal reply for {missing}\n"
                    f"{system.admission.tail(40)}\n{system.workers[0].tail(10)}") from exc
            late.poll(2.0)
            ends = _terminals(late, names.replies("late"))
            final = {r.request_id: r.status for r in _replies(late, names.replies("late"))
                     if r.terminal}
        finally:
            late.close()
    assert set(ends) == {r.request_id for r in reqs} and max(ends.values()) == 1
    assert set(final.values()) == {ReplyStatus.COMPLETED}


def _topics(bootstrap: str) -> set[str]:
    return set(make_admin(bootstrap).list_topics(timeout=10).topics)


def test_a_removed_tenant_is_answered_live_requests_rejected_new_ones_invalid(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    # `gone` may run one request at a time and waits long: its others stay queued
    cfg = fast_config(kafka_bootstrap, topic_names, tmp_path, gpus=1, tenants=[
        tenant("a"), tenant("gone", max_concurrency=1, max_queue_wait_ms=600_000)])
    names = topic_names
    rg = names.replies("gone")
    with running(cfg, tmp_path) as system:
        tail = Tail(kafka_bootstrap, [rg])
        try:
            time.sleep(4.0)  # the reload timer has seen the file once
            live = [_request(f"g-{i}", "gone", max_tokens=8000) for i in range(6)]  # 16 s each
            _produce_all(kafka_bootstrap, names.requests("gone"),
                         [(r.request_id.encode(), r.to_bytes()) for r in live])
            tail.wait(lambda: len({r.request_id for r in _replies(tail, rg)}) == 6, 60,
                      "the first replies", alive=system.admission.alive)
            assert not _terminals(tail, rg)  # one runs, the others wait
            _edit_tenants(system, [tenant("a")])
            tail.wait(lambda: len(_terminals(tail, rg)) == 6, 60,
                      "the removed tenant's live requests to be answered",
                      alive=system.admission.alive)
            late = _request("g-late", "gone")
            _produce_all(kafka_bootstrap, names.requests("gone"),
                         [(b"g-late", late.to_bytes())])
            tail.wait(lambda: "g-late" in _terminals(tail, rg), 60,
                      "the removed tenant's new request", alive=system.admission.alive)
            time.sleep(2.0)
            tail.poll(2.0)
        finally:
            tail.close()
    final = {r.request_id: r for r in _replies(tail, rg) if r.terminal}
    assert max(_terminals(tail, rg).values()) == 1
    for r in live:
        assert final[r.request_id].status is ReplyStatus.REJECTED
        assert final[r.request_id].reason is ReasonCode.UNKNOWN_TENANT
    assert final["g-late"].status is ReplyStatus.INVALID
    assert final["g-late"].reason is ReasonCode.UNKNOWN_TENANT
