"""Where the admission app's outputs go: replies, decisions, work items, controls, signals.

Crash safety by construction (docs/reliability.md, "Crash safety"). Outputs are not sent
when a handler makes them: they are staged in the current *batch*. A batch is sealed,
the tables' changelog is flushed (so every state change of the batch is durable), and
then a commit marker naming the batch (written first, so a takeover sees any batch left
open) and the batch's outputs go out in one Kafka transaction. Every table record
carries the outputs it caused that are not yet known to be committed (`pending_for`,
written by the service with the record), so after a crash recovery re-sends exactly the
outputs of batches whose marker never committed (`replay`). Consumers read committed
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from triage.kafka.clients import make_consumer, make_producer
from triage.topics.messages import Message, OutboxMark

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
# topic, key, value, partition (-1: by key), headers (a forward's origin; else none)
Output = tuple[str, bytes | None, bytes, int, Headers | None]
Pending = tuple[int, str, bytes]  # batch, topic, value (keyed by the record's id)
MARK_KEY = b"commit"
TXN_TIMEOUT_MS = 300_000
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

    def resume_after(self, committed: int, highest_seen: int = 0) -> None: ...

    def advance_past(self, highest_seen: int) -> None: ...

    def replay(self, key: str, outputs: Iterable[Pending], after: int | None = None) -> int: ...

    def flush(self, timeout_s: float = 10.0) -> int: ...


class BatchedOutbox:
    """Staging and bookkeeping shared by the Kafka outbox and the unit tests' list."""

    def __init__(self) -> None:
        self.seq = 1  # the batch being filled
        self.confirmed = 0  # the last batch known committed
        self.sealed = 0  # the last batch sealed (committed, or being committed)
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

    def resume_after(self, committed: int, highest_seen: int = 0) -> None:
        """After recovery: batches up to `committed` are out; number new ones above both."""
        self.confirmed = self.sealed = committed
        self.seq = max(committed, highest_seen) + 1

    def advance_past(self, highest_seen: int) -> None:
        """A shard taken over mid-run: number the batch being filled (and every later one)
        above every batch its records name, so that its partition's markers keep growing
        whoever owns it. Only ever moves up; what is staged just moves with the batch."""
        if highest_seen >= self.seq:
            self.seq = highest_seen + 1

    def replay(self, key: str, outputs: Iterable[Pending], after: int | None = None) -> int:
        """Stage again what a recovered record caused in batches that never committed
        (above `after`, the last batch committed for the record's shard; default: this
        process's)."""
        n = 0
        last = self.confirmed if after is None else after
        for seq, topic, value in outputs:
            if seq > last:
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

    def confirm(self, seq: int) -> None:
        """Batches up to `seq` are committed: their outputs need not travel with records."""
        self.confirmed = max(self.confirmed, seq)
        done = [k for k, outs in self._pending.items() if outs[-1][0] <= seq]
        for k in done:
            del self._pending[k]
        for k, outs in self._pending.items():
            if outs[0][0] <= seq:
                self._pending[k] = [o for o in outs if o[0] > seq]


@dataclass(frozen=True)
class MarksState:
    """What a shard's marks partition says: its last committed batch, who wrote it, and
    whether a transaction is open on the partition now."""

    seq: int
    writer: str | None
    open: bool


class KafkaOutbox(BatchedOutbox):
    """The production outbox: one transaction per batch, with a marker on `marks_topic`."""

    def __init__(self, bootstrap: str, *, transactional_id: str, marks_topic: str,
                 shards: int = 1) -> None:
        super().__init__()
        self.shards = shards
        self._bootstrap = bootstrap
        self._txn_id = transactional_id
        self.marks_topic = marks_topic
        # the marks partitions (shards) each batch's marker goes to: those this process
        # owns, so each shard's last committed batch is read from its own partition
        self.mark_partitions: set[int] = {0} if shards == 1 else set()
        self._plain = make_producer(bootstrap, **{"linger.ms": 5,
                                                  "delivery.report.only.error": True})
        self._producer: object | None = None
        self._stop = threading.Event()
        self.errors = 0
        self.last_commit_at = 0.0  # time.monotonic() of the last committed batch

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> int:
        """Fence any earlier incarnation (aborting its open transaction) and return the
        last committed batch. Retries while the broker is unreachable."""
        self._producer = self._new_producer()
        # unsharded, the app's one shard is read now; sharded, each shard's when it is
        # assigned (a fresh process has committed nothing of its own yet)
        committed = self.committed_for(0) if self.shards == 1 else 0
        self.resume_after(committed)
        log.info("outbox: last committed batch %d", committed)
        return committed

    def stop(self) -> None:
        """Stop retrying (shutdown): what is not committed is replayed on the next start."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _new_producer(self) -> object:
        def make() -> object:
            p = make_producer(self._bootstrap, **{
                "transactional.id": self._txn_id, "linger.ms": 5,
                "batch.num.messages": 5000,
                # a batch waits out a broker outage (librdkafka retries idempotently);
                # with 30 s its messages timed out, the batch aborted and was resent
                "message.timeout.ms": TXN_TIMEOUT_MS, "transaction.timeout.ms": TXN_TIMEOUT_MS,
                "delivery.report.only.error": True,
            })
            p.init_transactions(30.0)
            return p
        return self._retry("start the transactional producer", make)

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

    def committed_for(self, shard: int) -> int:
        """The last batch committed for `shard` (its marks partition; blocking, retried)."""
        return self._retry("read the outbox marker", lambda: self._last_marker(shard)).seq

    def take_over(self, shard: int) -> int:
        """The last batch committed for `shard`, read when this process adopts it. When its
        previous owner left a transaction open (killed mid-batch: every batch marks each
        shard its writer holds), that writer is fenced first: its transaction is aborted
        now, not at its timeout (TXN_TIMEOUT_MS), and read_committed readers (workers,
        clients) stop waiting behind it."""
        state = self._retry("read the outbox marker", lambda: self._last_marker(shard))
        if state.open and state.writer not in (None, self._txn_id):
            assert state.writer is not None
            writer = state.writer
            self._retry(f"fence {writer}", lambda: self._fence(writer))
            log.warning("shard %d: its previous writer %s left a transaction open: fenced "
                        "(the transaction is aborted)", shard, writer)
            state = self._retry("read the outbox marker", lambda: self._last_marker(shard))
        elif state.open:
            log.warning("shard %d: an open transaction of an unknown writer holds its "
                        "readers until it times out", shard)
        return state.seq

    def _fence(self, writer: str) -> None:
        """Take the transactional id `writer` over once: the coordinator aborts its open
        transaction and bumps its epoch (the old process, if alive, is fenced and starts a
        new producer, resending its batch)."""
        p = make_producer(self._bootstrap, **{"transactional.id": writer,
                                              "transaction.timeout.ms": TXN_TIMEOUT_MS})
        p.init_transactions(30.0)

    def _last_marker(self, partition: int) -> MarksState:
        """The last committed marker of a marks partition (seq 0 when there is none), and
        whether a transaction is open on it (its stable end short of its end)."""
        c = make_consumer(self._bootstrap, f"{self._txn_id}.marks", **{
            "isolation.level": "read_committed", "enable.partition.eof": True})
        try:
            tp = TopicPartition(self.marks_topic, partition)
            low, high = c.get_watermark_offsets(tp, timeout=10.0, cached=False)
            if high <= low:
                return MarksState(0, None, False)
            c.assign([TopicPartition(self.marks_topic, partition, max(low, high - 64))])
            last, writer = 0, None
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:
                msg = c.poll(1.0)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # read_committed, EOF lies at the last stable offset; the high
                        # watermark of the last fetch (cached: a fresh query would answer
                        # the stable offset again) lies past it while a transaction is open
                        stable = c.position([tp])[0].offset
                        _low, end = c.get_watermark_offsets(tp, cached=True)
                        return MarksState(last, writer, 0 <= stable < end)
                    raise KafkaException(err)
                if msg.key() == MARK_KEY:
                    mark = OutboxMark.from_bytes(msg.value() or b"")
                    if mark.seq >= last:
                        last, writer = mark.seq, mark.writer
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "reading the outbox marks"))
        finally:
            c.close()

    # --- sending ----------------------------------------------------------------------
    def send_internal(self, topic: str, key: bytes, value: bytes, partition: int = -1) -> None:
        """A message outside any batch (clock ticks): never replayed, never waited for."""
        # a tick dropped while the broker is away is fine: the next one follows
        with contextlib.suppress(BufferError):
            self._plain.produce(topic, value=value, key=key, partition=partition)
        self._plain.poll(0)

    def poll(self) -> None:
        self._plain.poll(0)

    def publish(self, seq: int, batch: list[Output]) -> None:
        """Send a sealed batch and its marker in one transaction (blocking; retries with
        backoff through broker outages until it commits or stop() is called)."""
        self._retry(f"commit output batch {seq}", lambda: self._publish_once(seq, batch))
        self.last_commit_at = time.monotonic()

    def _publish_once(self, seq: int, batch: list[Output]) -> None:
        p: object = self._producer
        try:
            p.begin_transaction()  # type: ignore[attr-defined]
            # the mark first, and on the broker before any output: a process killed
            # mid-batch then always leaves its transaction open on the marks partition,
            # where a takeover looks for it (`take_over`). Produced together, librdkafka
            # may write an output first, and a kill between the two held that output's
            # partition for TXN_TIMEOUT_MS with nothing on the marks to say so.
            mark = OutboxMark(seq=seq, writer=self._txn_id).to_bytes()
            for shard in sorted(self.mark_partitions):
                self._produce(p, self.marks_topic, MARK_KEY, mark, shard)
            if self.mark_partitions and p.flush(30.0):  # type: ignore[attr-defined]
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "writing the mark"))
            for topic, key, value, partition, headers in batch:
                self._produce(p, topic, key, value, partition, headers)
            while True:
                try:
                    p.commit_transaction(30.0)  # type: ignore[attr-defined]
                    return
                except KafkaException as exc:
                    err = exc.args[0]
                    if not (isinstance(err, KafkaError) and err.retriable()) or self.stopping:
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
                self._producer = self._new_producer()
            else:
                try:
                    p.abort_transaction(30.0)  # type: ignore[attr-defined]
                except KafkaException as abort_exc:
                    log.warning("outbox: abort failed (%s); new producer", abort_exc)
                    self._producer = self._new_producer()
            raise

    def _produce(self, p: object, topic: str, key: bytes | None, value: bytes,
                 partition: int = -1, headers: Headers | None = None) -> None:
        while True:
            try:
                p.produce(topic, value=value, key=key,  # type: ignore[attr-defined]
                          partition=partition, headers=headers)
                return
            except BufferError:  # local queue full: let librdkafka drain, then retry
                p.poll(0.05)  # type: ignore[attr-defined]

    def flush(self, timeout_s: float = 10.0) -> int:
        """Flush the plain producer (ticks); batches are committed by `publish`."""
        return int(self._plain.flush(timeout_s))


class OutboxStoppedError(Exception):
    """The outbox was stopped while it waited for the broker."""


class OutboxFencedError(Exception):
    """A newer producer took this process's transactional id over: it is a zombie."""


class ListOutbox(BatchedOutbox):
    """An outbox that keeps what was published (unit tests of the service). Unit tests
    that do not model crashes read `messages`, which holds every send at once."""

    def __init__(self) -> None:
        super().__init__()
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

    def commit(self) -> int:
        """Seal and 'publish' the current batch; returns its number."""
        seq, batch = self.seal()
        self.published.extend((t, k.decode() if k else None, v) for t, k, v, _, _ in batch)
        self.confirm(seq)
        return seq

    def flush(self, timeout_s: float = 10.0) -> int:
        return 0

    def on(self, topic: str) -> list[bytes]:
        return [v for t, _, v in self.messages if t == topic]
