"""Thin confluent-kafka wrappers: one place for client settings.

Producers are idempotent with acks=all and a short linger so Kafka batches;
consumers commit after processing (enable.auto.commit is off). Every client is
built by `client_config`, which routes librdkafka's own log lines (``%3|...|FAIL|``
on stderr by default) through Python logging (at WARNING, once per cause) and adds
the security settings its process declared for the bootstrap address
(triage/kafka/security.py: SASL/TLS); explicit overrides win over them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Set
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from triage.kafka.security import registered_settings

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 2,
    "compression.type": "lz4",
    "message.timeout.ms": 30_000,
    # Java's (and aiokafka's) partitioner, so a key lands on the same partition whichever
    # client wrote it: Faust tables rely on co-partitioning with our producers.
    "partitioner": "murmur2_random",
}

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "enable.partition.eof": False,
    "session.timeout.ms": 10_000,
    "topic.metadata.refresh.interval.ms": 2_000,
}


LIBRDKAFKA_LOGGER = "triage.kafka.librdkafka"
# What varies between repeats of one cause: the thread tag, timings, suppression counts.
_VARYING = re.compile(
    r"\[thrd:[^\]]*\]:\s*"
    r"|\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)"
    r"|,?\s*\d+ identical error\(s\) suppressed"
    r"|\d+(?:\.\d+)?ms"
)


_THREAD = re.compile(r"^\[thrd:[^\]]*\]:\s*")


class LibrdkafkaLog:
    """The ``logger`` of every client: librdkafka's lines go to Python logging at WARNING
    (its DEBUG/INFO/NOTICE lines are dropped), and a cause already logged within
    `window_s` is counted, not repeated. Unreachable brokers are what produce floods of
    identical FAIL lines; callers report the failure that matters themselves.

    confluent-kafka calls ``log(level, fmt, facility, client_name, message)`` from the
    thread that polls the client."""

    def __init__(self, logger: logging.Logger, window_s: float = 300.0) -> None:
        self._logger = logger
        self._window_s = window_s
        self._seen: dict[str, tuple[float, int]] = {}  # cause -> (first logged, repeats)
        self._lock = threading.Lock()

    @staticmethod
    def cause(facility: str, message: str) -> str:
        return f"{facility}|{_VARYING.sub('', message).strip()}"

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if level < logging.WARNING:
            return
        facility, client, message = [*args, "", "", ""][:3] if args else ("", "", fmt)
        key = self.cause(str(facility), str(message))
        now = time.monotonic()
        with self._lock:
            first, repeats = self._seen.get(key, (0.0, -1))
            if repeats >= 0 and now - first < self._window_s:
                self._seen[key] = (first, repeats + 1)
                return
            self._seen[key] = (now, 0)
            if len(self._seen) > 1024:  # bounded: forget the oldest causes
                for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:512]:
                    del self._seen[old]
        more = f" (repeated {repeats} times in {self._window_s:.0f} s)" if repeats > 0 else ""
        shown = _THREAD.sub("", str(message))
        self._logger.warning("librdkafka %s [%s]: %s%s", facility, client, shown, more)


KAFKA_LOG = LibrdkafkaLog(logging.getLogger(LIBRDKAFKA_LOGGER))


def client_config(bootstrap: str, *defaults: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The one place every client's settings are put together: bootstrap, the security
    settings declared for it, the kind's defaults, the caller's overrides, and the log
    routing."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, **registered_settings(bootstrap)}
    for d in defaults:
        conf.update(d)
    conf.update(overrides)
    conf.setdefault("logger", KAFKA_LOG)
    return conf


def make_producer(bootstrap: str, **overrides: Any) -> Producer:
    return Producer(client_config(bootstrap, PRODUCER_DEFAULTS, **overrides))


def make_consumer(bootstrap: str, group_id: str, **overrides: Any) -> Consumer:
    return Consumer(client_config(bootstrap, {"group.id": group_id}, CONSUMER_DEFAULTS,
                                  **overrides))  # fmt: skip


def make_admin(bootstrap: str, **overrides: Any) -> AdminClient:
    return AdminClient(client_config(bootstrap, **overrides))


def produce_waiting(producer: Producer, topic: str, value: bytes | None, key: bytes | None = None,
                    partition: int = -1, *, headers: list[Any] | None = None,
                    on_delivery: Callable[..., Any] | None = None,
                    backoff_s: float = 0.05) -> None:
    """produce(), waiting while librdkafka's local queue is full (a burst, or a broker
    outage): serving delivery reports for `backoff_s` frees room. Nothing is dropped."""
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition,
                             on_delivery=on_delivery, headers=headers)
            return
        except BufferError:
            producer.poll(backoff_s)


def broker_reachable(bootstrap: str, timeout_s: float = 2.0, **overrides: Any) -> bool:
    """True when a metadata request succeeds: an open port is not enough."""
    try:
        md = make_admin(bootstrap, **overrides).list_topics(timeout=timeout_s)
    except Exception as exc:  # confluent_kafka raises KafkaException on timeout
        log.debug("metadata request to %s failed: %s", bootstrap, exc)
        return False
    return bool(md.brokers)


T = TypeVar("T")


def poll_until_done(
    pending: Callable[[], Set[T]], timeout_s: float, every_s: float = 0.1
) -> Set[T]:
    """Ask `pending` (what the broker has not done yet) until it is empty or `timeout_s`
    passes; returns what is still pending then (empty: done). For broker state that
    lands a moment after the call that asked for it (topic leaders, ACLs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = pending()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(every_s)


def wait_for_group_coordinator(bootstrap: str, timeout_s: float = 120.0, **overrides: Any) -> None:
    """A fresh broker creates __consumer_offsets on the first group request and answers
    NOT_COORDINATOR meanwhile, which a consumer's first offset fetch does not retry: a
    control read would find nothing. Ask until the coordinator answers."""
    c = make_consumer(bootstrap, "triage-warm-up", log_level=0, **overrides)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                c.committed([TopicPartition("triage-warm-up", 0)], timeout=5)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()
