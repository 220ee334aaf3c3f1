"""Reading a partition back, as a read_committed consumer (a worker, a client) would."""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition

from triage.kafka.clients import make_consumer


def read_partition(bootstrap: str, topic: str, partition: int = 0) -> list[Message]:
    """Every committed message of the partition, from its start up to its end (none when
    an open transaction holds the partition back)."""
    c = make_consumer(bootstrap, f"{topic}.reader", **{"enable.partition.eof": True})
    out: list[Message] = []
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        for _ in range(30):
            msg = c.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                break
            if err is None:
                out.append(msg)
        return out
    finally:
        c.close()
