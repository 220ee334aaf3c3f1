"""The gap guard's second read of a skipped range, against real Kafka: it must see what
Faust's (read_uncommitted) consumer sees, even behind a transaction left open."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from triage.kafka.clients import make_admin, make_producer
from triage.streams.gaps import GapGuard, GapReadError, read_again, read_range


def _topic(bootstrap: str) -> str:
    name = f"gap-{uuid.uuid4().hex[:8]}"
    admin = make_admin(bootstrap)  # held until the result: its handle must outlive it
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    return name


def test_a_skipped_range_behind_an_open_transaction_is_read_whole(kafka_bootstrap: str) -> None:
    """The stall of CI's takeover: a forward of a killed instance left its transaction open
    before the range; a read_committed reader waited its whole timeout and found nothing."""
    topic = _topic(kafka_bootstrap)
    plain = make_producer(kafka_bootstrap)
    plain.produce(topic, b"r0", partition=0)
    plain.flush(10)
    zombie = Producer({"bootstrap.servers": kafka_bootstrap,
                       "transactional.id": f"{topic}.zombie"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"forward", partition=0)  # offset 1, never committed here
    zombie.flush(10)
    for i in (2, 3, 4):
        plain.produce(topic, f"r{i}".encode(), partition=0)
    plain.flush(10)
    try:
        got = read_range(kafka_bootstrap, "gap-test", topic, 0, 2, 4, timeout_s=20.0)
        assert [(off, value) for off, _key, value, _headers in got] == [(2, b"r2"), (3, b"r3")]
    finally:
        zombie.abort_transaction(30)


def test_a_range_that_cannot_be_read_raises_and_read_again_counts_what_it_found(
    kafka_bootstrap: str,
) -> None:
    topic = _topic(kafka_bootstrap)
    with pytest.raises(GapReadError, match=rf"{topic}\[0\] 0..1"):
        read_range(kafka_bootstrap, "gap-test", topic, 0, 0, 2, timeout_s=0.0)
    plain = make_producer(kafka_bootstrap)
    for i in range(3):
        plain.produce(topic, f"r{i}".encode(), partition=0)
    plain.flush(10)
    guard = GapGuard()
    got = asyncio.run(read_again(guard, kafka_bootstrap, "gap-test", topic, 0, 1, 3))
    assert [value for _off, _key, value, _headers in got] == [b"r1", b"r2"]
    assert guard.recovered == 2
