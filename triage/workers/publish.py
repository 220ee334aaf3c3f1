"""An asyncio face on confluent-kafka's producer: ``send`` returns a future that resolves
when the broker acknowledged the message (acks=all), so the worker commits its input
only after its output is durable. A daemon thread polls for delivery reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

from confluent_kafka import KafkaError, Producer

from triage.kafka.clients import produce_waiting
from triage.topics.messages import Message

log = logging.getLogger(__name__)


class DeliveryError(Exception):
    """The broker did not take a message (after the producer's own retries)."""


class AsyncProducer:
    def __init__(self, producer: Producer, loop: asyncio.AbstractEventLoop) -> None:
        self._producer = producer
        self._loop = loop
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="worker-producer", daemon=True)
        self._thread.start()

    def send(self, topic: str, key: str, message: Message,
             partition: int = -1) -> asyncio.Future[None]:
        """`partition`: where it must go (a shard's input); -1: by key."""
        fut: asyncio.Future[None] = self._loop.create_future()

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop gone at shutdown: nobody waits
                self._loop.call_soon_threadsafe(_settle, fut, err)

        produce_waiting(self._producer, topic, message.to_bytes(), key.encode(), partition,
                        on_delivery=delivered)
        return fut

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for outstanding deliveries; return how many are still undelivered."""
        left: int = self._producer.flush(timeout_s)
        if left:
            log.error("%d message(s) still undelivered after %.0fs", left, timeout_s)
        return left

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        self._closed.set()
        self._thread.join(timeout=2.0)

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)


def _settle(fut: asyncio.Future[None], err: KafkaError | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(DeliveryError(str(err)))
