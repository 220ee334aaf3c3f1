"""At-least-once bookkeeping: which attempts ran, and which offsets may be committed.

Kafka redelivers whatever was not committed when a worker stopped, so a worker must
recognize work it already ran: a bounded set of finished work ids, seeded at start
from the tail of the completions topic (the completions this GPU published before a
restart). Offsets commit only below the oldest message still being worked on, because
attempts finish out of order (continuous batching) and a commit past a running one
would lose it in a crash.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict

from confluent_kafka import Consumer, KafkaException, TopicPartition

from triage.kafka.clients import make_consumer
from triage.topics.messages import completions_in

log = logging.getLogger(__name__)


class BoundedIdSet:
    """A set that forgets its oldest members beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> None:
        self._ids[key] = None
        self._ids.move_to_end(key)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def discard(self, key: str) -> None:
        self._ids.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class OffsetTracker:
    """Per partition: offsets received but not finished, and the commit position.

    Thread-safe: rebalance callbacks run on the consumer's polling thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], set[int]] = {}
        self._next: dict[tuple[str, int], int] = {}  # highest offset seen + 1
        self._committed: dict[tuple[str, int], int] = {}

    def received(self, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            tp = (topic, partition)
            self._pending.setdefault(tp, set()).add(offset)
            self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def finished(self, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            self._pending.get((topic, partition), set()).discard(offset)

    def in_flight(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._pending.values())

    def committable(self) -> list[TopicPartition]:
        """Positions that moved since the last call: below every unfinished offset."""
        out: list[TopicPartition] = []
        with self._lock:
            for tp, nxt in self._next.items():
                pending = self._pending.get(tp)
                pos = min(pending) if pending else nxt
                if self._committed.get(tp, -1) < pos:
                    self._committed[tp] = pos
                    out.append(TopicPartition(tp[0], tp[1], pos))
        return out

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions revoked: whatever still runs there will be redelivered elsewhere."""
        with self._lock:
            for p in partitions:
                tp = (p.topic, p.partition)
                self._pending.pop(tp, None)
                self._next.pop(tp, None)
                self._committed.pop(tp, None)


def completed_work_ids(
    bootstrap: str, topic: str, gpu_id: str, *, tail: int = 20_000, timeout_s: float = 10.0
) -> list[str]:
    """Work ids this GPU reported in the last ``tail`` messages of each completions partition."""
    consumer = make_consumer(bootstrap, f"triage-worker-{gpu_id}-seed", log_level=4)
    found: list[str] = []
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            log.info("no completions topic %s yet: nothing to seed", topic)
            return found
        assign: list[TopicPartition] = []
        ends: dict[int, int] = {}
        for p in meta.partitions:
            marks = _watermarks(consumer, TopicPartition(topic, p), timeout_s)
            if marks is None:
                log.warning("cannot read %s[%d] offsets; its finished work may rerun", topic, p)
                continue
            low, high = marks
            if high > low:
                ends[p] = high
                assign.append(TopicPartition(topic, p, max(low, high - tail)))
        if not assign:
            return found
        consumer.assign(assign)
        deadline = time.monotonic() + timeout_s
        needle = f'"gpu_id":"{gpu_id}"'.encode()
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                if msg.error() is not None:
                    continue
                value = msg.value() or b""
                if needle in value:  # cheap filter before parsing
                    with contextlib.suppress(ValueError):
                        found.extend(f"{c.request_id}#{c.attempt}" for c in completions_in(value)
                                     if c.gpu_id == gpu_id)
                part, offset = msg.partition(), msg.offset()
                if part is not None and offset is not None and offset + 1 >= ends.get(part, 0):
                    ends.pop(part, None)
        if ends:
            log.warning("seeding done work ids from %s timed out; some may rerun", topic)
    finally:
        consumer.close()
    return found


def _watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float) -> tuple[int, int] | None:
    """Low and high offsets, retrying transient errors (a leader moving, metadata lag)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            marks = consumer.get_watermark_offsets(tp, timeout=max(0.5, timeout_s / 4))
        except KafkaException as exc:
            if time.monotonic() >= deadline:
                log.debug("watermarks of %s[%d]: %s", tp.topic, tp.partition, exc)
                return None
            time.sleep(0.2)
            continue
        if marks is None:
            return None
        return int(marks[0]), int(marks[1])
