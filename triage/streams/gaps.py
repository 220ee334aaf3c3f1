"""Never skip a request, whatever Faust does at startup.

faust-streaming 0.15.3 resumes a stream partition before it seeks it to the committed
offset, and treats a jump in offsets as a gap it may commit past. After a restart the
first request it hands us can therefore lie beyond the committed offset: the requests
in between were never seen, and their offsets get committed anyway (measured: 326 of
14,400 requests skipped at one of five kill -9s under 80 requests/s). So the request
agent checks the first offset of each partition against the group's committed offset (read
from the broker when the partition's shard is adopted) and reads a skipped range again
with its own consumer before going on.

Faust drops records mid-stream too, around a rebalance: a record whose hand-off to the
stream was cut short when the flow stopped is marked read, and is not handed out again
(measured: a new tenant's 60 requests, read while the resubscription that added its
topic settled, came as offsets 0..49, 51..59, 59; request 50 never got a reply). So for
WATCH_S after every revocation and assignment every jump in a request partition's
offsets is read again too (and of the completions partitions: a dropped completion
would leave its request running for ever); a jump that held only a transaction's commit
marker reads back empty.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from triage.kafka.clients import make_consumer

log = logging.getLogger(__name__)

Key = tuple[str, int]  # topic, partition
# offset, key, value, headers
Record = tuple[int, bytes | None, bytes | None, Any]  # headers as confluent-kafka gives them


WATCH_S = 10.0  # after a rebalance, every jump in offsets is checked this long


class GapGuard:
    """The next offset expected per partition; says which range was skipped."""

    def __init__(self) -> None:
        self.expected: dict[Key, int] = {}
        self.last: dict[Key, int] = {}  # the highest offset handed to us per partition
        self.watch_until = float("-inf")
        self.recovered = 0

    def watch(self, now: float) -> None:
        """A rebalance began or ended: check every jump for the next WATCH_S."""
        self.watch_until = max(self.watch_until, now + WATCH_S)

    def resume(self, partition: int) -> None:
        """A shard kept across a rebalance: each of its partitions is expected to go on
        no further than just past the last offset handed out before it (Faust rewinds
        to the committed offset, which is never past that)."""
        for key, last in self.last.items():
            if key[1] == partition:
                self.expected.setdefault(key, last + 1)

    def start_at(self, committed: dict[Key, int]) -> None:
        for k, off in committed.items():
            if off >= 0:
                self.expected.setdefault(k, off)

    def forget(self, partition: int) -> None:
        """A shard handed over: what this process expected of its partitions no longer
        holds (another process reads them now); a later adoption starts afresh."""
        for k in [k for k in self.expected if k[1] == partition]:
            del self.expected[k]
        for k in [k for k in self.last if k[1] == partition]:
            del self.last[k]

    def check(self, topic: str, partition: int, offset: int,
              now: float = float("-inf")) -> tuple[int, int] | None:
        """The skipped [start, end) before `offset`: if it is the first offset of its
        partition since start_at and lies past the committed one, or, while watching
        (`now` before watch_until), if it lies past the last one seen plus one.
        Elsewhere a later jump is no gap: the commit marker of each transaction that
        forwarded a request here takes an offset no consumer sees."""
        key = (topic, partition)
        last = self.last.get(key)
        if last is None or offset > last:
            self.last[key] = offset
        exp = self.expected.pop(key, None)
        if exp is not None and offset > exp:
            return exp, offset
        if last is not None and offset > last + 1 and now < self.watch_until:
            return last + 1, offset
        return None


def committed_offsets(bootstrap: str, group: str, topics: Iterable[str],
                      partitions: Iterable[int] = (0,)) -> dict[Key, int]:
    """The group's committed offsets of `partitions` of each topic (a shard's: the same
    partition number of every request topic); a partition never committed (a new
    tenant's, a fresh app's) is read from its beginning, so it starts at its low
    watermark. Empty when the broker cannot say (the guard then starts at the first
    offset seen)."""
    c = make_consumer(bootstrap, group, log_level=3)
    parts = list(partitions)
    try:
        tps = c.committed([TopicPartition(t, n) for t in topics for n in parts], timeout=10.0)
        out = {(tp.topic, tp.partition): tp.offset for tp in tps if tp.error is None}
        for key in [key for key, off in out.items() if off < 0]:
            out[key] = c.get_watermark_offsets(TopicPartition(*key), timeout=10.0)[0]
        return out
    except Exception as exc:  # a transport error: no guard start, not no app
        log.warning("could not read committed offsets of %s: %s", group, exc)
        return {}
    finally:
        c.close()


def read_range(bootstrap: str, group: str, topic: str, partition: int, start: int, end: int,
               timeout_s: float = 60.0) -> list[Record]:
    """The records of [start, end) of one partition, as Faust's consumer sees them
    (read_uncommitted, like aiokafka's default: a read_committed reader would wait behind
    any open transaction that wrote to the partition before `start`, such as a forward of
    a process just killed, for up to the transaction timeout, and then miss the range).
    `group` is never joined (the partition is assigned), but ACLs want a name the app may
    use. Raises GapReadError when the range cannot be read within `timeout_s`."""
    c = make_consumer(bootstrap, group, log_level=3,
                      **{"enable.partition.eof": True, "isolation.level": "read_uncommitted"})
    out: list[Record] = []
    try:
        c.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        tp = TopicPartition(topic, partition)
        while time.monotonic() < deadline:
            msg = c.poll(1.0)
            if msg is None:
                # past the range already (it held only transaction markers, which no
                # consumer is handed): nothing more will come from it
                pos = c.position([tp])[0].offset
                if pos is not None and pos >= end:
                    return out
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            off = msg.offset()
            if off is None:
                continue
            if off >= end:
                return out
            if off < start:  # the range was gone (retention): reset to the earliest
                continue
            out.append((off, msg.key(), msg.value(), msg.headers()))
        raise GapReadError(f"{topic}[{partition}] {start}..{end - 1}: read {len(out)} "
                           f"record(s) in {timeout_s:.0f}s, not the whole range")
    finally:
        c.close()


class GapReadError(RuntimeError):
    """A skipped range could not be read again: its requests would be lost."""


async def read_again(guard: GapGuard, bootstrap: str, group: str, topic: str, partition: int,
                     start: int, end: int) -> list[Record]:
    """The records Faust jumped over, read with a consumer of our own; retried until read
    (a request is never given up), the request agent waiting meanwhile."""
    for attempt in itertools.count():
        try:
            missed = await asyncio.to_thread(read_range, bootstrap, group, topic, partition,
                                             start, end)
        except Exception as exc:  # the broker unreachable, or the read timed out
            log.error("could not read skipped request offsets %s[%d] %d..%d again (%s); "
                      "retrying", topic, partition, start, end - 1, exc)
            await asyncio.sleep(min(2.0 ** attempt, 30.0))
            continue
        if missed:
            log.error("offsets %s[%d] %d..%d were skipped by the stream: read %d "
                      "record(s) again", topic, partition, start, end - 1, len(missed))
        else:  # only transaction markers lay there (the commit of a forward)
            log.info("offsets %s[%d] %d..%d held no request", topic, partition, start, end - 1)
        guard.recovered += len(missed)
        return missed
    raise AssertionError("unreachable")
