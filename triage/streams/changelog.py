"""Faust tables' changelog writes through confluent-kafka instead of Faust's aiokafka
producer.

Every table write is a changelog record. Through Faust it is a `send_soon` on aiokafka's
producer: a future, a callback and the produce request's encoding and socket writes, all
in Python on the event loop's thread, which is the app's bottleneck (~15-20% of its
samples at 3 writes per request; docs/architecture.md, "The changelog through
librdkafka"). Here a write is one `produce()` call; librdkafka batches, encodes and sends
on its own threads, outside the GIL.

What stays Faust's: the tables, their RocksDB stores, recovery and standby replicas
(which read the changelog topics, whoever wrote them) and the partition a write goes to
(`partition_for_key`: the event's partition when sharded). What moves here: the send,
and the bookkeeping Faust did in its delivery callback (the persisted offset per
changelog partition, so a restart reads only the changelog's tail), now done once per
flush with the highest offset delivered.

Durability is unchanged: the committer flushes this producer before each batch's
outputs are committed and before Faust commits input offsets (committer.py), as it
flushed Faust's producer before. The committer waits for the writes made before it
asked (`mark`, then `settle` on the event loop's thread), not for the producer to
empty, and serves the delivery reports itself (docs/architecture.md, "A flush bounded
to its batch"). A write librdkafka could not deliver (its message timeout passed)
would leave RocksDB ahead of the changelog, so `settle` raises and the process exits
rather than commit past it: restarted, it rebuilds from the changelog and reads the
inputs again (docs/reliability.md).
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from faust.types import TP

from triage.kafka.clients import make_producer, produce_waiting

log = logging.getLogger(__name__)

# A broker outage must not fail a write: librdkafka retries it this long (as workers do)
MESSAGE_TIMEOUT_MS = 600_000
POLL_S = 0.005  # a blocking flush's wait per poll for delivery reports


class ChangelogLostError(RuntimeError):
    """A changelog record was not delivered: RocksDB holds a write the changelog lacks."""


class ChangelogProducer:
    """The changelog writer of one process's tables (attach each table once)."""

    def __init__(self, bootstrap: str, message_timeout_ms: int = MESSAGE_TIMEOUT_MS) -> None:
        self._producer: Producer = make_producer(bootstrap, **{
            "linger.ms": 5, "message.timeout.ms": message_timeout_ms})
        self._tables: dict[str, Any] = {}  # changelog topic -> its table
        self._lock = threading.Lock()
        self._delivered: dict[tuple[str, int], int] = {}  # (topic, partition) -> offset
        self._lost: list[str] = []
        # Writes are counted per epoch (`mark` closes one): produced on the event loop's
        # thread only, settled (delivered or lost) by the delivery callbacks under _lock.
        # A closed epoch's produced count no longer changes, so it is safe to read.
        self._epoch = 0
        self._produced: dict[int, int] = {}
        self._settled: dict[int, int] = {}
        self._done_below = 0  # every epoch below this one has settled
        self._callback = partial(self._on_delivery, 0)

    def attach(self, table: Any) -> None:
        """Route `table`'s changelog writes here (replaces its on_key_set/on_key_del)."""
        topic = table.changelog_topic.get_topic_name()
        self._tables[topic] = table
        produce = self._produce

        def on_key_set(key: Any, value: Any) -> None:
            partition = produce(topic, table.partition_for_key(key), key, value)
            table._maybe_set_key_ttl(key, partition)
            table._sensor_on_set(table, key, value)

        def on_key_del(key: Any) -> None:
            partition = produce(topic, table.partition_for_key(key), key, None)
            table._maybe_del_key_ttl(key, partition)
            table._sensor_on_del(table, key)

        table.on_key_set = on_key_set
        table.on_key_del = on_key_del

    def _produce(self, topic: str, partition: int | None, key: bytes, value: bytes | None,
                 ) -> int:
        # One partition per table unless sharded (then the event's own): Faust's
        # partitioner is only ever asked for partition 0 of a one-partition table.
        part = 0 if partition is None else partition
        epoch = self._epoch
        self._produced[epoch] = self._produced.get(epoch, 0) + 1
        produce_waiting(self._producer, topic, value, key, part, on_delivery=self._callback)
        return part

    def mark(self) -> int:
        """Close the current epoch of writes and return it: `settle` of it waits for these
        writes and no later ones. Call on the thread that writes (the event loop's)."""
        epoch = self._epoch
        self._epoch += 1
        self._callback = partial(self._on_delivery, self._epoch)
        return epoch

    def _on_delivery(self, epoch: int, err: KafkaError | None, msg: Message) -> None:
        topic, partition = msg.topic(), msg.partition()
        with self._lock:
            self._settled[epoch] = self._settled.get(epoch, 0) + 1
            if err is not None:
                self._lost.append(f"{topic}[{partition}]: {err}")
                return
            offset = msg.offset()
            key = (str(topic), int(partition or 0))
            if offset is not None and offset > self._delivered.get(key, -1):
                self._delivered[key] = offset

    def settle(self, upto: int, wait_s: float = 0.0) -> bool:
        """Serve the delivery reports that have come (waiting up to `wait_s` for one) and
        say whether every write of the epochs up to `upto` has settled. Raises
        ChangelogLostError when librdkafka gave a write up.

        The committer calls it on the event loop's thread between short sleeps: served
        there, each report's callback finds the GIL at hand. Served by a flush in a
        helper thread, each one waited for the loop's thread to let the GIL go (up to the
        switch interval) while the app decided, and a batch's flush took 0.1-0.7 s in a
        request flood (docs/architecture.md, "A flush bounded to its batch")."""
        self._producer.poll(wait_s)
        with self._lock:
            lost = self._lost[:]
            if lost:
                raise ChangelogLostError(
                    f"{len(lost)} changelog write(s) not delivered: {lost[0]}")
            e = self._done_below
            while e <= upto and self._settled.get(e, 0) >= self._produced.get(e, 0):
                self._settled.pop(e, None)
                self._produced.pop(e, None)
                e += 1
            self._done_below = e
        return e > upto

    def pending(self) -> int:
        """Writes not yet delivered (or delivered, their reports not yet served)."""
        return len(self._producer)

    def flush(self, timeout_s: float) -> bool:
        """Deliver every write made so far, blocking (off the event loop, or in tests):
        True when all were delivered, False when `timeout_s` passed first. Raises
        ChangelogLostError when librdkafka gave one up."""
        upto = self.mark()
        deadline = time.monotonic() + timeout_s
        while not self.settle(upto, wait_s=min(POLL_S, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return False
        return True

    def persist_offsets(self) -> None:
        """Record in each table's RocksDB the highest changelog offset delivered per
        partition since the last call (what Faust's own delivery callback did per write).
        Call on the event loop's thread: Faust's stores are not shared across threads."""
        with self._lock:
            delivered, self._delivered = self._delivered, {}
        for (topic, partition), offset in delivered.items():
            table = self._tables.get(topic)
            if table is not None:
                table.data.set_persisted_offset(TP(topic, partition), offset)
