"""The reply reader: one background thread per client routes replies to waiters.

Replies are keyed by request_id on the tenant's reply topic. The reader assigns
every partition itself (no consumer group: each client must see every reply of
its tenant, and a group would split them between clients) and starts at the
high watermarks read *before* the client produces anything. Any reply to a
request sent afterwards is appended after those offsets, so none can be missed;
replies already on the topic (other clients, earlier runs) are skipped.
Starting from OFFSET_END instead would be resolved lazily when fetching begins,
which leaves a window where a fast reply lands before the resolved end.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import ValidationError

from triage.client.errors import (
    ClientClosedError,
    ClientError,
    DuplicateRequestError,
    ReplyTimeoutError,
    ReplyTopicError,
)
from triage.topics.messages import InferenceRequest, Reply

log = logging.getLogger(__name__)

UpdateCallback = Callable[[Reply], None]

POLL_S = 0.1  # consumer poll timeout: also bounds how fast stop() is noticed
BATCH = 256  # messages per consume() call
PARTITION_REFRESH_S = 5.0  # how often to look for partitions added to the reply topic
RETRY_S = 0.1  # pause between tries while a fresh topic elects its leaders
_FRESH_TOPIC_ERRORS = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)


class Submission:
    """One attempt in flight: the request, the replies seen so far, a future for the last."""

    def __init__(self, request: InferenceRequest, on_update: UpdateCallback | None = None) -> None:
        self.request = request
        self.future: Future[Reply] = Future()
        self._history: list[Reply] = []
        self._lock = threading.Lock()
        self._on_update = on_update

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def history(self) -> tuple[Reply, ...]:
        """Every reply received for this attempt, in arrival order (terminal last)."""
        with self._lock:
            return tuple(self._history)

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout_s: float | None = None) -> Reply:
        """The terminal reply; ReplyTimeoutError when none came within ``timeout_s``."""
        try:
            return self.future.result(timeout=timeout_s)
        except FutureTimeout:
            raise ReplyTimeoutError(self.request_id, timeout_s or 0.0, self.history) from None

    def deliver(self, reply: Reply) -> bool:
        """Record a reply (reader thread). True when it was terminal and settled the future."""
        with self._lock:
            if self.future.done():
                return False  # a redelivered or late reply after the terminal one
            self._history.append(reply)
        if self._on_update is not None:
            try:
                self._on_update(reply)
            except Exception:
                log.exception("on_update callback failed for %s", reply.request_id)
        if not reply.terminal:
            return False
        try:
            self.future.set_result(reply)
        except InvalidStateError:  # cancelled by an asyncio waiter that timed out
            return False
        return True

    def fail(self, exc: BaseException) -> None:
        with contextlib.suppress(InvalidStateError):  # already settled or cancelled
            self.future.set_exception(exc)


class ReplyRouter:
    """Owns the reply consumer and its thread; maps request ids to Submissions."""

    def __init__(
        self,
        *,
        consumer: Consumer,
        topic: str,
        on_idle: Callable[[], object] = lambda: None,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._on_idle = on_idle  # run every loop: the client serves producer callbacks here
        self._waiters: dict[str, Submission] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._dead: BaseException | None = None
        self._partitions: set[int] = set()
        self._thread = threading.Thread(
            target=self._run, name=f"triage-replies-{topic}", daemon=True
        )

    def start(self, timeout_s: float) -> None:
        """Assign every partition at its current end, then start reading. Call before producing."""
        try:
            md = self._consumer.list_topics(self._topic, timeout=timeout_s)
        except KafkaException as exc:
            raise ReplyTopicError(f"cannot read metadata of {self._topic}: {exc}") from exc
        tmd = md.topics.get(self._topic)
        if tmd is not None and tmd.error is not None and \
                tmd.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # fmt: skip
            raise ReplyTopicError(
                f"this principal may not read reply topic {self._topic}: kafka.security must "
                "name the tenant's own user (docs/security.md)"
            )
        if tmd is None or tmd.error is not None or not tmd.partitions:
            why = tmd.error.str() if tmd is not None and tmd.error is not None else "no partitions"
            raise ReplyTopicError(
                f"reply topic {self._topic} is not usable ({why}); create the topics first "
                "(`triage topics create`)"
            )
        assignment = []
        deadline = time.monotonic() + timeout_s
        for p in sorted(tmd.partitions):
            high = self._end_offset(p, deadline)
            assignment.append(TopicPartition(self._topic, p, high))
            self._partitions.add(p)
        self._consumer.assign(assignment)
        log.debug(
            "reading %s from %s", self._topic, [(tp.partition, tp.offset) for tp in assignment]
        )
        self._thread.start()

    def _end_offset(self, partition: int, deadline: float) -> int:
        """High watermark of one partition, retrying the transient errors of a fresh topic
        (no leader elected yet) until ``deadline``."""
        tp = TopicPartition(self._topic, partition)
        while True:
            left = deadline - time.monotonic()
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    tp, timeout=max(0.1, left), cached=False
                )
                return int(high)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                transient = isinstance(err, KafkaError) and (
                    err.retriable() or err.code() in _FRESH_TOPIC_ERRORS
                )
                if not transient or left <= 0:
                    raise ReplyTopicError(
                        f"cannot read the end offset of {self._topic}[{partition}]: {exc}"
                    ) from exc
                log.debug("end offset of %s[%d] not ready: %s", self._topic, partition, exc)
                time.sleep(RETRY_S)

    def register(self, sub: Submission) -> None:
        with self._lock:
            if self._dead is not None or self._stop.is_set():
                raise ClientClosedError(f"the reply reader has stopped: {self._dead or 'closed'}")
            if sub.request_id in self._waiters:
                raise DuplicateRequestError(f"{sub.request_id} is already awaiting its reply")
            self._waiters[sub.request_id] = sub

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._waiters.pop(request_id, None)

    def pending(self) -> int:
        with self._lock:
            return len(self._waiters)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, fail whatever still waits. The thread closes its own consumer."""
        self._stop.set()
        if self._thread.ident is None:  # never started: nobody else will close it
            with contextlib.suppress(RuntimeError):
                self._consumer.close()
        elif threading.current_thread() is not self._thread:  # not from an on_update callback
            self._thread.join(timeout_s)
        self._fail_all(ClientClosedError("the client was closed before the reply came"))

    def _run(self) -> None:
        next_refresh = time.monotonic() + PARTITION_REFRESH_S
        try:
            while not self._stop.is_set():
                self._on_idle()
                for msg in self._consumer.consume(num_messages=BATCH, timeout=POLL_S):
                    self._handle(msg.error(), msg.value(), msg.partition())
                if time.monotonic() >= next_refresh:
                    self._assign_new_partitions()
                    next_refresh = time.monotonic() + PARTITION_REFRESH_S
        except Exception as exc:
            log.exception("reply reader for %s died", self._topic)
            with self._lock:
                self._dead = exc
            self._fail_all(ClientClosedError(f"the reply reader died: {exc}"))
        finally:
            with contextlib.suppress(RuntimeError):  # already closed
                self._consumer.close()

    def _handle(self, err: KafkaError | None, value: bytes | None, partition: int | None) -> None:
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            log.debug("reply consumer: %s", err.str())
            return
        if value is None:
            return
        try:
            reply = Reply.from_bytes(value)
        except ValidationError as exc:
            log.warning("unparseable reply on %s[%s]: %s", self._topic, partition, exc)
            return
        with self._lock:
            sub = self._waiters.get(reply.request_id)
        if sub is None:
            return  # another client's request, or one we stopped waiting for
        if sub.deliver(reply):
            self.forget(reply.request_id)

    def _assign_new_partitions(self) -> None:
        """Partitions added after start hold only newer replies: read them from the start."""
        try:
            md = self._consumer.list_topics(self._topic, timeout=1.0)
        except KafkaException as exc:
            log.debug("partition refresh of %s failed: %s", self._topic, exc)
            return
        tmd = md.topics.get(self._topic)
        if tmd is None or tmd.error is not None:
            return
        new = sorted(set(tmd.partitions) - self._partitions)
        if new:
            self._consumer.incremental_assign(
                [TopicPartition(self._topic, p, OFFSET_BEGINNING) for p in new]
            )
            self._partitions.update(new)
            log.info("reply topic %s grew: now reading partitions %s too", self._topic, new)

    def _fail_all(self, exc: ClientError) -> None:
        with self._lock:
            waiters = list(self._waiters.values())
            self._waiters.clear()
        for sub in waiters:
            sub.fail(exc)
