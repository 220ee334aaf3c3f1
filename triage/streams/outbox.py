"""Where the admission app's outputs go: replies, decisions, work items, controls, signals.

One confluent-kafka producer (idempotent, acks=all, a short linger so Kafka batches).
Faust's own producer path costs several times more per message; this one is flushed
before Faust commits input offsets (see app.py), so at-least-once holds.
"""

from __future__ import annotations

import logging
from typing import Protocol

from triage.kafka.clients import make_producer
from triage.topics.messages import Message

log = logging.getLogger(__name__)


class Outbox(Protocol):
    """Anything that can carry the app's outputs (Kafka, or a list in unit tests)."""

    def send(self, topic: str, key: str, message: Message) -> None: ...

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None: ...

    def flush(self, timeout_s: float = 10.0) -> int: ...


class KafkaOutbox:
    """The production outbox."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = make_producer(bootstrap, **{
            "linger.ms": 5,
            "batch.num.messages": 5000,
            "delivery.report.only.error": True,  # no Python callback per delivered message
        })
        self.errors = 0
        self.sent = 0

    def _on_delivery(self, err: object, _msg: object) -> None:
        if err is not None:
            self.errors += 1
            log.error("delivery failed: %s", err)

    def send(self, topic: str, key: str, message: Message) -> None:
        self.send_raw(topic, key.encode(), message.to_bytes())

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: let librdkafka drain, then retry
                self._producer.poll(0.05)
        self.sent += 1
        if self.sent % 256 == 0:
            self._producer.poll(0)

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Block until everything sent so far is acknowledged; returns what is left."""
        return int(self._producer.flush(timeout_s))


class ListOutbox:
    """An outbox that keeps what was sent (unit tests of the service)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str | None, bytes]] = []

    def send(self, topic: str, key: str, message: Message) -> None:
        self.messages.append((topic, key, message.to_bytes()))

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.messages.append((topic, key.decode() if key else None, value))

    def flush(self, timeout_s: float = 10.0) -> int:
        return 0

    def on(self, topic: str) -> list[bytes]:
        return [v for t, _, v in self.messages if t == topic]
