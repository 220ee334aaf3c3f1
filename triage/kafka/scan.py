"""Reading a time range of a topic: every partition, from where the range starts to the
partition's end as of the scan's start (audit and replay both read this way).

Every partition is scanned because keys cannot be trusted to pick one (other writers
may partition differently). offsets_for_times finds where the range starts and ends on
each partition, so a long retention costs nothing outside the range; messages written
after the scan started are left for the next scan, so a scan always ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

CONSUME_BATCH = 1000
POLL_S = 0.1
EARLIEST, LATEST = -2, -1  # ListOffsets' special timestamps


class ScanTimeoutError(Exception):
    """The scan's deadline passed before every partition was read to its end."""


class ReadTimeoutError(KafkaException):
    """`read_to_end` did not reach the partition's end in time (a KafkaException, so the
    outbox's retry loop retries it like any transport error)."""


@dataclass(frozen=True, slots=True)
class Read:
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes | None


def left(deadline: float) -> float:
    """Seconds to the deadline (monotonic clock); ScanTimeoutError once it has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ScanTimeoutError
    return remaining


def _list_offsets(
    consumer: Consumer, topic: str, parts: list[int], at: int, deadline: float
) -> dict[int, int]:
    """One ListOffsets request for every partition (get_watermark_offsets costs a round
    trip per partition, and often a wait): `at` a timestamp, EARLIEST or LATEST."""
    found = consumer.offsets_for_times([TopicPartition(topic, p, at) for p in parts],
                                       timeout=left(deadline))
    return {tp.partition: tp.offset for tp in found}


def scan_range(
    consumer: Consumer, topic: str, partitions: Iterable[int], *, since_ms: int | None,
    until_ms: int | None, deadline: float,
) -> Iterator[Read]:
    """Every message of `topic` with a timestamp in [since_ms, until_ms], in offset order
    per partition, up to each partition's end as of now. The consumer must have
    ``enable.partition.eof`` set. Raises ScanTimeoutError at the deadline."""
    parts = sorted(partitions)
    starts = _list_offsets(consumer, topic, parts, EARLIEST, deadline)
    ends = _list_offsets(consumer, topic, parts, LATEST, deadline)
    if since_ms is not None:
        for p, off in _list_offsets(consumer, topic, parts, since_ms, deadline).items():
            # -1: nothing at or after since_ms on that partition
            starts[p] = max(starts[p], off) if off >= 0 else ends[p]
    if until_ms is not None:
        for p, off in _list_offsets(consumer, topic, parts, until_ms + 1, deadline).items():
            if off >= 0:
                ends[p] = min(ends[p], off)
    active = {p for p in parts if starts[p] < ends[p]}
    if not active:
        return
    consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(active)])
    try:
        while active:
            # consume() waits its whole timeout for a full batch: keep it short
            batch = consumer.consume(num_messages=CONSUME_BATCH,
                                     timeout=min(POLL_S, left(deadline)))
            for msg in batch:
                part, offset = msg.partition() or 0, msg.offset() or 0
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        active.discard(part)
                        continue
                    raise KafkaException(err)
                end = ends.get(part, 0)
                if offset >= end - 1:
                    active.discard(part)  # the end as of the scan's start
                if offset >= end:
                    continue
                ts = msg.timestamp()[1]
                if (since_ms is not None and 0 <= ts < since_ms) or (
                    until_ms is not None and ts > until_ms
                ):
                    continue  # out of order timestamps near the range's edges
                yield Read(part, offset, ts, msg.value())
    finally:
        consumer.unassign()


def read_to_end(consumer: Consumer, what: str, *, timeout_s: float, poll_s: float = 1.0,
                end: int | None = None) -> Iterator[Message]:
    """The messages of the consumer's one assigned partition, until its end: the end of
    partition event (the consumer must have ``enable.partition.eof`` set; under
    read_committed it comes at the last stable offset), or the message at `end - 1`.
    Raises KafkaException on a read error, and ReadTimeoutError naming `what` when the
    end is not reached within `timeout_s`. One loop for the readers of small control
    partitions (outbox marks, routes) instead of one per module."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(poll_s)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            raise KafkaException(err)
        yield msg
        if end is not None and (msg.offset() or 0) + 1 >= end:
            return
    raise ReadTimeoutError(KafkaError(KafkaError._TIMED_OUT, f"reading {what}"))
