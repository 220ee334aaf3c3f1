"""The outbox's two transactional lanes: one for work, one for replies.

Why two (docs/architecture.md, "Two lanes"). A Kafka transaction pays for every
partition it writes: librdkafka sends one produce request per partition, at most five
in flight, and the broker verifies each partition with the transaction coordinator. At
1,000 tenants a batch's replies touch hundreds of reply partitions, and one transaction
took 0.4-3.7 s. A work item in that batch reached its GPU only when the whole batch
committed, so every sequence slot was held that long: the pool completed 150-250
requests a second while deciding 1,600. Work items, hand-offs and controls go to a few
partitions, so they get their own transactional producer (the *work* lane), committed
every cycle; replies and decision records follow on the *reply* lane, whose larger
transactions amortize their partitions over many batches.

Each lane has its own marks topic: a committed marker there says every output of that
lane in that batch and all before it is on the broker. A batch's reply outputs are
committed only after its work outputs, so the reply lane's mark never passes the work
lane's, and recovery re-sends each output whose own lane had not committed its batch
(`Committed`), never one that is already out.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from triage.kafka.clients import make_consumer, make_producer
from triage.kafka.clients import produce_waiting as produce  # the seam takeover tests patch
from triage.kafka.scan import read_to_end
from triage.topics.messages import OutboxMark

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
# topic, key, value, partition (-1: by key), headers (a forward's origin; else none)
Output = tuple[str, bytes | None, bytes, int, Headers | None]
MARK_KEY = b"commit"
MARKS_WINDOW = 64  # offsets read back from a marks partition's stable end, at first
TXN_TIMEOUT_MS = 300_000
T = TypeVar("T")


class Retry(Protocol):
    """The outbox's retry loop: fn until it succeeds, backing off; stop() ends it."""

    def __call__(self, what: str, fn: Callable[[], T]) -> T: ...


def reply_lane_id(transactional_id: str) -> str:
    """The reply lane's transactional id, beside the work lane's."""
    return f"{transactional_id}.replies"


def reply_marks_topic(marks_topic: str) -> str:
    """The reply lane's marks topic, beside the work lane's (same partitions: shards)."""
    return f"{marks_topic}.replies"


@dataclass(frozen=True)
class MarksState:
    """What a lane's marks partition says: its last committed batch, who wrote it, and
    whether a transaction is open on the partition now."""

    seq: int
    writer: str | None
    open: bool
    lanes: int = 1  # what the last mark's writer ran with (OutboxMark.lanes)
    open_writer: str | None = None  # named by the earliest open transaction's mark


@dataclass(frozen=True, slots=True)
class Committed:
    """The last batch each lane committed for a shard (replies <= work)."""

    work: int
    replies: int

    @classmethod
    def read(cls, work: MarksState, replies: MarksState | None) -> Committed:
        """From each lane's marks. A reply lane with no mark yet, beside work marks of a
        one-lane writer (before 2026-12-06), holds nothing: that writer's batches held
        their replies, so they are out up to its last batch, not owed since batch 0."""
        if replies is None or (replies.seq == 0 and replies.writer is None and work.lanes == 1):
            return cls(work.seq, work.seq)
        return cls(work.seq, replies.seq)

    @classmethod
    def of(cls, committed: int | Committed) -> Committed:
        """A bare batch number means both lanes (one-lane outboxes, unit tests)."""
        return committed if isinstance(committed, Committed) else cls(committed, committed)

    @property
    def low(self) -> int:
        return min(self.work, self.replies)

    @property
    def high(self) -> int:
        return max(self.work, self.replies)


class TxnLane:
    """One transactional producer and its marks topic: batches committed in order, each
    with a marker per owned shard written first (so a takeover sees a batch left open)."""

    def __init__(self, bootstrap: str, *, transactional_id: str, marks_topic: str,
                 retry: Retry, lanes: int = 1) -> None:
        self.lanes = lanes  # the outbox's (written in each mark)
        self.bootstrap = bootstrap
        self.txn_id = transactional_id
        self.marks_topic = marks_topic
        self._retry = retry
        self.producer: Producer | None = None
        # held for each transaction: a process leaving as a zombie takes it, so it exits
        # only once a transaction its send check is aborting has ended (`quiesce`)
        self.busy = threading.Lock()

    def start(self) -> None:
        """Fence any earlier incarnation of this id (aborting its open transaction)."""
        self.producer = self._new_producer()

    def _new_producer(self) -> Producer:
        def make() -> Producer:
            p = make_producer(self.bootstrap, **{
                "transactional.id": self.txn_id, "linger.ms": 5,
                "batch.num.messages": 5000,
                # a batch waits out a broker outage (librdkafka retries idempotently);
                # with 30 s its messages timed out, the batch aborted and was resent
                "message.timeout.ms": TXN_TIMEOUT_MS, "transaction.timeout.ms": TXN_TIMEOUT_MS,
                "delivery.report.only.error": True,
            })
            p.init_transactions(30.0)
            return p
        return self._retry("start the transactional producer", make)

    def publish_once(self, seq: int, batch: Iterable[Output], mark_partitions: Collection[int],
                     stopping: Callable[[], bool], also_marks: str | None = None,
                     still_member: Callable[[], bool] | None = None) -> None:
        """One transaction: the marks (on `also_marks` too: the other lane's, when this
        transaction carries its outputs as well), then the outputs (raises
        OutboxFencedError when a newer owner took this id over, or when `still_member`,
        asked once the marks are on the broker, says the group went on without this
        process; other errors leave a fresh or aborted producer)."""
        with self.busy:
            self._publish_once(seq, batch, mark_partitions, stopping, also_marks, still_member)

    def _publish_once(self, seq: int, batch: Iterable[Output], mark_partitions: Collection[int],
                      stopping: Callable[[], bool], also_marks: str | None,
                      still_member: Callable[[], bool] | None) -> None:
        p = self.producer
        if p is None:
            raise RuntimeError("TxnLane.publish_once before start()")
        try:
            p.begin_transaction()
            # the mark first, and on the broker before any output: a process killed
            # mid-batch then always leaves its transaction open on the marks partition,
            # where a takeover looks for it (`take_over`). Produced together, librdkafka
            # may write an output first, and a kill between the two held that output's
            # partition for TXN_TIMEOUT_MS with nothing on the marks to say so.
            mark = OutboxMark(seq=seq, writer=self.txn_id, lanes=self.lanes).to_bytes()
            for topic in [t for t in (self.marks_topic, also_marks) if t is not None]:
                for shard in sorted(mark_partitions):
                    produce(p, topic, mark, MARK_KEY, shard)
            if mark_partitions and p.flush(30.0):
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "writing the mark"))
            if still_member is not None and not still_member():
                # frozen between the guard's check and the mark (lapse.py, SendCheck): a
                # takeover meanwhile saw no open transaction, so it did not fence this id
                # and re-sent the batch itself; committing it would answer it twice
                with contextlib.suppress(KafkaException):
                    p.abort_transaction(30.0)
                raise OutboxFencedError(f"batch {seq}: the group no longer lists this "
                                        "process (frozen past its session timeout)")
            for topic, key, value, partition, headers in batch:
                produce(p, topic, value, key, partition,
                        headers=headers)
            while True:
                try:
                    p.commit_transaction(30.0)
                    return
                except KafkaException as exc:
                    err = exc.args[0]
                    if not (isinstance(err, KafkaError) and err.retriable()) or stopping():
                        raise
                    time.sleep(0.2)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._FENCED:
                # another process took a shard of ours over and fenced this id: this one
                # was frozen or cut off past its session timeout, and what it decided
                # since may be stale. Re-initializing would send the batch anyway.
                raise OutboxFencedError(f"batch {seq}: {err.str()}") from exc
            if isinstance(err, KafkaError) and err.fatal():
                self.producer = self._new_producer()
            else:
                try:
                    p.abort_transaction(30.0)
                except KafkaException as abort_exc:
                    log.warning("outbox: abort failed (%s); new producer", abort_exc)
                    self.producer = self._new_producer()
            raise

    def take_over(self, shard: int) -> MarksState:
        """The last batch this lane committed for `shard`, fencing every writer that left
        a transaction open there (killed mid-batch), so that read_committed readers
        (workers, clients) stop waiting behind it now, not at its timeout. The writer of
        an open transaction is the one its own mark names (every batch writes its mark
        first), not the last committed mark's writer: after a takeover those differ.
        Read while this lane holds no transaction of its own (its lock: a shard adopted
        again after a missed rebalance may still carry this lane's marks), so an open
        one is never this process's."""
        with self.busy:
            return self._take_over(shard)

    def _take_over(self, shard: int) -> MarksState:
        state = self._retry("read the outbox marker", lambda: self.last_marker(shard))
        for _ in range(3):  # each round fences the earliest open transaction's writer
            writer = state.open_writer
            if not state.open or writer is None or writer == self.txn_id:
                break
            self._retry(f"fence {writer}", functools.partial(self._fence, writer))
            log.warning("shard %d: writer %s left a transaction open: fenced (the "
                        "transaction is aborted)", shard, writer)
            state = self._retry("read the outbox marker", lambda: self.last_marker(shard))
        if state.open:
            log.warning("shard %d: a transaction of writer %s is still open: it holds the "
                        "shard's readers until it ends or times out", shard,
                        state.open_writer or "unknown")
        return state

    def _fence(self, writer: str) -> None:
        """Take the transactional id `writer` over once: the coordinator aborts its open
        transaction and bumps its epoch (the old process, if alive, is fenced)."""
        p = make_producer(self.bootstrap, **{"transactional.id": writer,
                                             "transaction.timeout.ms": TXN_TIMEOUT_MS})
        p.init_transactions(30.0)

    def last_marker(self, partition: int) -> MarksState:
        """The last committed marker of a marks partition (seq 0 when there is none), and
        whether a transaction is open on it (its stable end short of its end)."""
        c = make_consumer(self.bootstrap, f"{self.txn_id}.marks", **{
            "isolation.level": "read_committed", "enable.partition.eof": True})
        try:
            tp = TopicPartition(self.marks_topic, partition)
            # read_committed, the high watermark answered is the last stable offset: a
            # transaction left open holds it at its first record, however many marks
            # were committed after it (the window starts below it, never past it, and
            # a partition whose first record is the open one still gets a fetch)
            low, stable_end = c.get_watermark_offsets(tp, timeout=10.0, cached=False)
            window = MARKS_WINDOW
            while True:
                start = max(low, stable_end - window)
                c.assign([TopicPartition(self.marks_topic, partition, start)])
                last, writer, lanes = 0, None, 1
                for msg in read_to_end(c, "the outbox marks", timeout_s=30.0):
                    if msg.key() == MARK_KEY:
                        mark = OutboxMark.from_bytes(msg.value() or b"")
                        if mark.seq >= last:
                            last, writer, lanes = mark.seq, mark.writer, mark.lanes
                # a window of aborted batches (each a mark and an abort marker, which a
                # read_committed reader skips) holds no committed mark: look further back
                if last or start <= low:
                    break
                window *= 4
            # at the end, the position is the stable offset (the start when nothing was
            # read); the high watermark of the last fetch (cached: a fresh query would
            # answer the stable offset again) lies past it while a transaction is open
            position = c.position([tp])[0].offset
            stable = position if position >= 0 else start
            _low, end = c.get_watermark_offsets(tp, cached=True)
            is_open = stable < end
            opened = self._open_writer(tp, stable) if is_open else None
            return MarksState(last, writer, is_open, lanes, opened)
        finally:
            c.close()

    def _open_writer(self, tp: TopicPartition, stable: int) -> str | None:
        """The writer named by the mark at the stable offset (read uncommitted): the first
        record of the earliest transaction open on the partition. Marks after it may be
        committed ones of a live writer, whom fencing would stop for nothing."""
        c = make_consumer(self.bootstrap, f"{self.txn_id}.marks", **{
            "isolation.level": "read_uncommitted", "enable.partition.eof": True})
        try:
            c.assign([TopicPartition(tp.topic, tp.partition, stable)])
            for msg in read_to_end(c, "the open mark", timeout_s=30.0):
                if msg.key() == MARK_KEY:
                    return OutboxMark.from_bytes(msg.value() or b"").writer or None
            return None
        finally:
            c.close()


class OutboxStoppedError(Exception):
    """The outbox was stopped while it waited for the broker."""


class OutboxFencedError(Exception):
    """A newer producer took this process's transactional id over: it is a zombie."""
