"""The chaos observer's account of unanswered requests (`Observer.explain_outstanding`),
on the real broker: a terminal reply held back by an open transaction is told apart from
one never written. The fault tests print it when a wait for every answer times out."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer

from triage.chaos.observe import Observer
from triage.kafka.clients import make_producer
from triage.topics.admin import TopicSpec, ensure_topics
from triage.topics.messages import Reply, ReplyStatus
from triage.topics.names import TopicKind, TopicNames
from triage.topics.reasons import ReasonCode


def _reply(rid: str) -> bytes:
    return Reply(request_id=rid, tenant="a", status=ReplyStatus.COMPLETED,
                 reason=ReasonCode.COMPLETED, at_ms=int(time.time() * 1000)).to_bytes()


def test_a_reply_an_open_transaction_holds_is_told_from_one_never_written(
    kafka_bootstrap: str, topic_names: TopicNames
) -> None:
    names = topic_names
    ensure_topics(kafka_bootstrap, [
        TopicSpec(names.replies("a"), TopicKind.REPLIES, 1, 1),
        TopicSpec(names.completions, TopicKind.COMPLETIONS, 1, 1),
        TopicSpec(names.deadletter, TopicKind.DEADLETTER, 1, 1),
    ])
    obs = Observer(kafka_bootstrap, names, ["a"])
    obs.start()
    txn: Producer = make_producer(kafka_bootstrap, **{
        "transactional.id": f"{names.prefix}-held-{uuid.uuid4().hex[:6]}"})
    try:
        for rid in ("answered", "held", "never"):
            obs.expect(rid, "a", time.time())
        plain = make_producer(kafka_bootstrap)
        plain.produce(names.replies("a"), _reply("answered"), b"answered")
        plain.flush(10)
        deadline = time.monotonic() + 30
        while obs.outstanding() > 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert obs.outstanding() == 2  # "answered" was read
        txn.init_transactions(30)
        txn.begin_transaction()
        for rid in ("held", "other-1", "other-2", "other-3", "other-4"):
            txn.produce(names.replies("a"), _reply(rid), rid.encode())
        txn.flush(10)  # in the log, but their transaction stays open
        time.sleep(1.0)
        assert obs.outstanding() == 2
        told = obs.explain_outstanding(read_s=10.0)
        assert told.startswith("2 unanswered"), told
        assert "1 with a terminal reply (e.g. ['held'])" in told, told
        assert "0 with a completion" in told, told
        # the read_committed observer has read the first reply only: 5 records behind
        assert f"{names.replies('a')}[0]': 'read to 0 of 6'" in told, told
        txn.abort_transaction(30)
    finally:
        obs.stop()
