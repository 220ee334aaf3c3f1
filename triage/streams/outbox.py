"""Where the admission app's outputs go: replies, decisions, work items, controls, signals.

Crash safety by construction (docs/reliability.md, "Crash safety"). Outputs are not sent
when a handler makes them: they are staged in the current *batch*. A batch is sealed,
the tables' changelog is flushed (so every state change of the batch is durable), and
then its outputs go out in Kafka transactions, each with a commit marker naming the batch
(written first, so a takeover sees any batch left open): the work outputs on the work
lane, then the replies and decision records on the reply lane (lanes.py says why two).
Every table record
carries the outputs it caused that are not yet known to be committed (`pending_for`,
written by the service with the record), so after a crash recovery re-sends exactly the
outputs whose lane's marker for their batch never committed (`replay`). Consumers read committed
data only (librdkafka's default), so an aborted or half-sent batch is never seen. Input
offsets are committed only after every batch made from them has committed (app.py), so
no input is lost either.

Ticks are clock pulses, not state: they go through a plain producer (`send_internal`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Literal, Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException

from triage.kafka.clients import make_producer
from triage.streams.lanes import (
    MARK_KEY,
    Committed,
    Headers,
    MarksState,
    OutboxFencedError,
    OutboxStoppedError,
    Output,
    TxnLane,
    reply_lane_id,
    reply_marks_topic,
)
from triage.topics.messages import Message

log = logging.getLogger(__name__)

__all__ = ["MARK_KEY", "Committed", "Headers", "OutboxFencedError", "OutboxStoppedError",
           "Output", "reply_marks_topic"]

Pending = tuple[int, str, bytes]  # batch, topic, value (keyed by the record's id)
Lane = Literal["work", "replies", "both"]  # what one transaction carries (`publish`)
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
T = TypeVar("T")


class Outbox(Protocol):
    """Anything that can carry the app's outputs (Kafka, or a list in unit tests)."""

    def send(self, topic: str, key: str, message: Message) -> None: ...

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None: ...

    def forward(self, topic: str, partition: int, key: bytes | None, value: bytes,
                headers: Headers | None = None) -> None: ...

    def pending_for(self, key: str) -> list[Pending]: ...

    @property
    def seq(self) -> int: ...

    @property
    def confirmed(self) -> int: ...

    @property
    def lane_confirmed(self) -> Committed: ...

    def resume_after(self, committed: int | Committed, highest_seen: int = 0) -> None: ...

    def advance_past(self, highest_seen: int) -> None: ...

    def replay(self, key: str, outputs: Iterable[Pending],
               after: int | Committed | None = None) -> int: ...

    def flush(self, timeout_s: float = 10.0) -> int: ...


class BatchedOutbox:
    """Staging and bookkeeping shared by the Kafka outbox and the unit tests' list.
    `is_reply` names the topics of the reply lane (None: one lane carries everything)."""

    def __init__(self, is_reply: Callable[[str], bool] | None = None) -> None:
        self.seq = 1  # the batch being filled
        self.lane_confirmed = Committed(0, 0)  # the last batch each lane committed
        self.confirmed = 0  # the last batch known committed on both lanes
        self.sealed = 0  # the last batch sealed (committed, or being committed)
        self.is_reply = is_reply
        self._staged: list[Output] = []
        self._pending: dict[bytes, list[Pending]] = {}
        self.sent = 0
        self.replayed = 0

    def send(self, topic: str, key: str, message: Message) -> None:
        self.send_raw(topic, key.encode(), message.to_bytes())

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._staged.append((topic, key, value, -1, None))
        if key is not None:
            self._pending.setdefault(key, []).append((self.seq, topic, value))
        self.sent += 1

    def forward(self, topic: str, partition: int, key: bytes | None, value: bytes,
                headers: Headers | None = None) -> None:
        """An input read on the wrong shard, sent on to its own partition in this batch.
        Nothing to replay: until the batch commits the input's offset is not committed
        either, so a crash reads (and forwards) it again."""
        self._staged.append((topic, key, value, partition, headers))
        self.sent += 1

    def pending_for(self, key: str) -> list[Pending]:
        """Outputs under this key not yet known committed (stored with the key's record)."""
        return list(self._pending.get(key.encode(), ()))

    def staged(self) -> int:
        return len(self._staged)

    def resume_after(self, committed: int | Committed, highest_seen: int = 0) -> None:
        """After recovery: batches up to `committed` are out (per lane); number new ones
        above every one of them and `highest_seen`."""
        c = Committed.of(committed)
        self.lane_confirmed = c
        self.confirmed = c.low
        self.sealed = c.high
        self.seq = max(c.high, highest_seen) + 1

    def advance_past(self, highest_seen: int) -> None:
        """A shard taken over mid-run: number the batch being filled (and every later one)
        above every batch its records name, so that its partition's markers keep growing
        whoever owns it. Only ever moves up; what is staged just moves with the batch."""
        if highest_seen >= self.seq:
            self.seq = highest_seen + 1

    def replay(self, key: str, outputs: Iterable[Pending],
               after: int | Committed | None = None) -> int:
        """Stage again what a recovered record caused in batches whose lane never
        committed them (above `after`, the last batches committed for the record's shard;
        default: this process's)."""
        n = 0
        last = Committed.of(self.lane_confirmed if after is None else after)
        is_reply = self.is_reply
        for seq, topic, value in outputs:
            if seq > (last.replies if is_reply is not None and is_reply(topic) else last.work):
                self.send_raw(topic, key.encode(), value)
                n += 1
        self.replayed += n
        return n

    def seal(self) -> tuple[int, list[Output]]:
        """Close the current batch; later sends go to the next one."""
        seq, batch = self.seq, self._staged
        self._staged = []
        self.seq += 1
        self.sealed = seq
        return seq, batch

    def split(self, batch: list[Output]) -> tuple[list[Output], list[Output]]:
        """A sealed batch's work outputs and its reply-lane outputs (in order)."""
        is_reply = self.is_reply
        if is_reply is None:
            return batch, []
        work: list[Output] = []
        replies: list[Output] = []
        for out in batch:
            (replies if is_reply(out[0]) else work).append(out)
        return work, replies

    def confirm(self, seq: int, *, work: bool = True, replies: bool = True) -> None:
        """Batches up to `seq` are committed on the lanes named: once both lanes have,
        their outputs need not travel with records."""
        c = self.lane_confirmed
        self.lane_confirmed = c = Committed(max(c.work, seq) if work else c.work,
                                            max(c.replies, seq) if replies else c.replies)
        if c.low <= self.confirmed:
            return
        self.confirmed = seq = c.low
        done = [k for k, outs in self._pending.items() if outs[-1][0] <= seq]
        for k in done:
            del self._pending[k]
        for k, outs in self._pending.items():
            if outs[0][0] <= seq:
                self._pending[k] = [o for o in outs if o[0] > seq]


class KafkaOutbox(BatchedOutbox):
    """The production outbox: each batch's work outputs in one transaction on the work
    lane, then its replies on the reply lane (lanes.py), each lane with its marks."""

    def __init__(self, bootstrap: str, *, transactional_id: str, marks_topic: str,
                 shards: int = 1, is_reply: Callable[[str], bool] | None = None) -> None:
        super().__init__(is_reply)
        self.shards = shards
        self._bootstrap = bootstrap
        self.marks_topic = marks_topic
        # the marks partitions (shards) each batch's marker goes to: those this process
        # owns, so each shard's last committed batch is read from its own partition
        self.mark_partitions: set[int] = {0} if shards == 1 else set()
        self._plain = make_producer(bootstrap, **{"linger.ms": 5,
                                                  "delivery.report.only.error": True})
        self._stop = threading.Event()
        self.errors = 0
        self.last_commit_at = 0.0  # time.monotonic() of the last committed batch
        # one lane (is_reply None): every output goes with the work, as before 2026-12-06
        lanes = 1 if is_reply is None else 2
        self.work = TxnLane(bootstrap, transactional_id=transactional_id,
                            marks_topic=marks_topic, retry=self._retry, lanes=lanes)
        self.replies = None if is_reply is None else TxnLane(
            bootstrap, transactional_id=reply_lane_id(transactional_id),
            marks_topic=reply_marks_topic(marks_topic), retry=self._retry, lanes=lanes)

    @property
    def lanes(self) -> list[TxnLane]:
        return [self.work] if self.replies is None else [self.work, self.replies]

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> Committed:
        """Fence any earlier incarnation (aborting its open transactions) and return the
        last committed batches. Retries while the broker is unreachable."""
        for lane in self.lanes:
            lane.start()
        # unsharded, the app's one shard is read now; sharded, each shard's when it is
        # assigned (a fresh process has committed nothing of its own yet)
        committed = self.committed_for(0) if self.shards == 1 else Committed(0, 0)
        self.resume_after(committed)
        log.info("outbox: last committed batch %d (replies %d)", committed.work,
                 committed.replies)
        return committed

    def stop(self) -> None:
        """Stop retrying (shutdown): what is not committed is replayed on the next start."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def quiesce(self, timeout_s: float) -> bool:
        """For a process about to exit as a zombie: wait until no lane is inside a
        transaction and keep every lane from starting another (never released). A lane
        whose send check found the process gone is then done aborting: exited before
        that, its marks-only transaction stayed open, and a reader of its marks saw an
        older batch as the last committed until the transaction timed out. False when a
        lane was still busy after `timeout_s` (the process exits anyway)."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        return all(lane.busy.acquire(timeout=max(0.0, deadline - time.monotonic()))
                   for lane in self.lanes)

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """Call fn until it succeeds (transport errors back off); stop() ends the wait."""
        attempt = 0
        while True:
            try:
                return fn()
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.fatal() and attempt > 20:
                    raise
                self.errors += 1
                wait = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                log.warning("outbox: could not %s (%s); retrying in %.1fs", what, exc, wait)
            if self._stop.wait(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]):
                raise OutboxStoppedError(what)
            attempt += 1

    def committed_for(self, shard: int) -> Committed:
        """The last batches committed for `shard` (its marks partitions; blocking, retried)."""
        def read(lane: TxnLane) -> MarksState:
            return self._retry("read the outbox marker", lambda: lane.last_marker(shard))
        return Committed.read(read(self.work), None if self.replies is None else read(self.replies))

    def take_over(self, shard: int) -> Committed:
        """The last batches committed for `shard`, read when this process adopts it. When
        its previous owner left a transaction open on a lane (killed mid-batch: every
        batch marks each shard its writer holds), that writer is fenced first."""
        work = self.work.take_over(shard)
        return Committed.read(work, None if self.replies is None
                              else self.replies.take_over(shard))

    # --- sending ----------------------------------------------------------------------
    def send_internal(self, topic: str, key: bytes, value: bytes, partition: int = -1) -> None:
        """A message outside any batch (clock ticks): never replayed, never waited for."""
        # a tick dropped while the broker is away is fine: the next one follows
        with contextlib.suppress(BufferError):
            self._plain.produce(topic, value=value, key=key, partition=partition)
        self._plain.poll(0)

    def poll(self) -> None:
        self._plain.poll(0)

    def publish(self, seq: int, batch: list[Output], lane: Lane = "work",
                still_member: Callable[[], bool] | None = None, *,
                marks: Collection[int]) -> None:
        """Send outputs and the lane's marker in one transaction (blocking; retries with
        backoff through broker outages until it commits or stop() is called). `lane`:
        "work", a sealed batch's work part; "replies", the reply parts of batches up to
        `seq`; "both", a whole batch on the work lane, marked on both lanes.
        `still_member`: asked once the marks are on the broker (lapse.py, SendCheck).
        `marks`: the shards the batch speaks for, as owned when it was sealed (the
        committer takes them at the seal: shards adopted since are not this batch's)."""
        txn = self.replies if lane == "replies" and self.replies is not None else self.work
        also = self.replies.marks_topic if lane == "both" and self.replies is not None else None
        self._retry(f"commit output batch {seq}", lambda: txn.publish_once(
            seq, batch, marks, lambda: self.stopping, also, still_member))
        self.last_commit_at = time.monotonic()

    def flush(self, timeout_s: float = 10.0) -> int:
        """Flush the plain producer (ticks); batches are committed by `publish`."""
        return int(self._plain.flush(timeout_s))


class ListOutbox(BatchedOutbox):
    """An outbox that keeps what was published (unit tests of the service). Unit tests
    that do not model crashes read `messages`, which holds every send at once."""

    def __init__(self, is_reply: Callable[[str], bool] | None = None) -> None:
        super().__init__(is_reply)
        self._owed: list[Output] = []  # replies of batches whose work lane committed
        self.messages: list[tuple[str, str | None, bytes]] = []
        self.published: list[tuple[str, str | None, bytes]] = []
        # topic, partition, value, headers
        self.forwarded: list[tuple[str, int, bytes, Headers | None]] = []

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        super().send_raw(topic, key, value)
        self.messages.append((topic, key.decode() if key else None, value))

    def forward(self, topic: str, partition: int, key: bytes | None, value: bytes,
                headers: Headers | None = None) -> None:
        super().forward(topic, partition, key, value, headers)
        self.forwarded.append((topic, partition, value, headers))

    def commit(self, *, replies: bool = True) -> int:
        """Seal and 'publish' the current batch; returns its number. `replies=False`:
        only its work lane commits (a crash between the lanes); its replies wait for the
        next commit that includes them, or are lost with the process."""
        seq, batch = self.seal()
        work, reply_part = self.split(batch)
        self.published.extend((t, k.decode() if k else None, v) for t, k, v, _, _ in work)
        self.confirm(seq, replies=self.is_reply is None)
        self._owed.extend(reply_part)
        if replies:
            self.published.extend((t, k.decode() if k else None, v)
                                  for t, k, v, _, _ in self._owed)
            self._owed = []
            self.confirm(seq)
        return seq

    def flush(self, timeout_s: float = 10.0) -> int:
        return 0

    def on(self, topic: str) -> list[bytes]:
        return [v for t, _, v in self.messages if t == topic]
