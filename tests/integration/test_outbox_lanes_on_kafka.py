"""The outbox's two lanes against real Kafka (streams/lanes.py): a batch's work is on the
broker before its replies, a takeover reads each lane's last committed batch from its
own marks, and a writer killed mid-transaction on the reply lane is fenced so that
tenants' readers do not wait out its transaction timeout."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from tests.integration._dying_outbox import run_until_killed
from tests.integration._reading import read_partition
from triage.kafka.clients import make_admin
from triage.streams.lanes import reply_marks_topic
from triage.streams.outbox import Committed, KafkaOutbox


def _topics(bootstrap: str, *names: str) -> None:
    admin = make_admin(bootstrap)  # held until the results: its handle must outlive them
    for f in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        f.result(timeout=30)


def _committed(bootstrap: str, topic: str, partition: int = 1) -> list[bytes]:
    return [m.value() or b"" for m in read_partition(bootstrap, topic, partition)]


def _layout(tag: str) -> tuple[str, str, str]:
    marks, work, replies = f"{tag}.outbox", f"{tag}.work", f"{tag}.replies"
    return marks, work, replies


def test_a_takeover_reads_each_lanes_last_batch(kafka_bootstrap: str) -> None:
    tag = f"lanes-{uuid.uuid4().hex[:8]}"
    marks, work, replies = _layout(tag)
    _topics(kafka_bootstrap, marks, reply_marks_topic(marks), work, replies)
    first = KafkaOutbox(kafka_bootstrap, transactional_id=f"{tag}.outbox.i0", marks_topic=marks,
                        shards=2, is_reply=replies.__eq__)
    first.start()
    first.mark_partitions.add(1)
    shards = first.mark_partitions
    first.publish(7, [(work, b"k", b"w7", 1, None)], marks=shards)
    first.publish(7, [(replies, b"k", b"r7", 1, None)], lane="replies", marks=shards)
    first.publish(8, [(work, b"k", b"w8", 1, None)], marks=shards)  # then the process dies
    assert _committed(kafka_bootstrap, work) == [b"w7", b"w8"]
    assert _committed(kafka_bootstrap, replies) == [b"r7"]
    survivor = KafkaOutbox(kafka_bootstrap, transactional_id=f"{tag}.outbox.i1",
                           marks_topic=marks, shards=2, is_reply=replies.__eq__)
    survivor.start()
    assert survivor.take_over(1) == Committed(work=8, replies=7)
    assert survivor.take_over(0) == Committed(0, 0)  # a shard nobody wrote


def test_a_writer_killed_mid_reply_transaction_is_fenced_on_takeover(
    kafka_bootstrap: str,
) -> None:
    tag = f"lanesk-{uuid.uuid4().hex[:8]}"
    marks, work, replies = _layout(tag)
    _topics(kafka_bootstrap, marks, reply_marks_topic(marks), work, replies)
    run_until_killed(kafka_bootstrap, f"{tag}.outbox.i0", marks, work, replies,
                     [(7, "work", "work", "w7"), (7, "replies", "replies", "r7"),
                      (8, "work", "work", "w8"), (8, "replies", "replies", "r8,last reply")],
                     last="last reply")
    later = Producer({"bootstrap.servers": kafka_bootstrap})
    later.produce(replies, b"new", partition=1)
    later.flush(10)
    assert _committed(kafka_bootstrap, replies) == [b"r7"]  # held behind the open batch 8
    survivor = KafkaOutbox(kafka_bootstrap, transactional_id=f"{tag}.outbox.i1",
                           marks_topic=marks, shards=2, is_reply=replies.__eq__)
    survivor.start()
    assert survivor.take_over(1) == Committed(work=8, replies=7)
    assert _committed(kafka_bootstrap, replies) == [b"r7", b"new"]  # 8's replies aborted
    assert _committed(kafka_bootstrap, work) == [b"w7", b"w8"]
