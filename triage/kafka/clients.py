"""Thin confluent-kafka wrappers: one place for client settings.

Producers are idempotent with acks=all and a short linger so Kafka batches;
consumers commit after processing (enable.auto.commit is off). Every client carries
the security settings its process declared for the bootstrap address
(triage/kafka/security.py: SASL/TLS); explicit overrides win over them.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from triage.kafka.security import registered_settings

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 2,
    "compression.type": "lz4",
    "message.timeout.ms": 30_000,
    # Java's (and aiokafka's) partitioner, so a key lands on the same partition whichever
    # client wrote it: Faust tables rely on co-partitioning with our producers.
    "partitioner": "murmur2_random",
}

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "enable.partition.eof": False,
    "session.timeout.ms": 10_000,
    "topic.metadata.refresh.interval.ms": 2_000,
}


def make_producer(bootstrap: str, **overrides: Any) -> Producer:
    conf = {"bootstrap.servers": bootstrap, **registered_settings(bootstrap), **PRODUCER_DEFAULTS,
            **overrides}
    return Producer(conf)


def make_consumer(bootstrap: str, group_id: str, **overrides: Any) -> Consumer:
    conf = {"bootstrap.servers": bootstrap, "group.id": group_id,
            **registered_settings(bootstrap), **CONSUMER_DEFAULTS, **overrides}
    return Consumer(conf)


def make_admin(bootstrap: str, **overrides: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **registered_settings(bootstrap),
                        **overrides})


def broker_reachable(bootstrap: str, timeout_s: float = 2.0, **overrides: Any) -> bool:
    """True when a metadata request succeeds: an open port is not enough."""
    try:
        md = make_admin(bootstrap, **overrides).list_topics(timeout=timeout_s)
    except Exception as exc:  # confluent_kafka raises KafkaException on timeout
        log.debug("metadata request to %s failed: %s", bootstrap, exc)
        return False
    return bool(md.brokers)
