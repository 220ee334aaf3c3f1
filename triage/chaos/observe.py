"""The outside client of a chaos run: one thread sends requests at a (time-varying) rate
with its own producer, another follows the reply and completion topics with its own
consumer, as a tenant and an auditor would. Nothing here talks to the app directly."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from triage.kafka.clients import make_consumer, make_producer, produce_waiting
from triage.kafka.scan import ScanTimeoutError, scan_range
from triage.topics.messages import (
    CompletionStatus,
    DeadLetter,
    InferenceRequest,
    Reply,
    completions_in,
)
from triage.topics.names import TopicNames

log = logging.getLogger(__name__)

QUIET = 2  # librdkafka log level: the broker going away on purpose is not news
RateFn = Callable[[float], float]  # seconds since start -> requests per second


@dataclass
class Seen:
    """One request as the client saw it."""

    tenant: str
    sent_at: float
    terminals: int = 0
    replies: int = 0  # any reply (queued, accepted, terminal)
    terminal: str | None = None
    terminal_at: float | None = None
    reported_latency_s: float | None = None  # what the app's completed reply says
    reason: str | None = None


class Sender(threading.Thread):
    """Sends requests round-robin over the tenants at `rate(t)` for `duration_s`. The
    producer waits out broker outages (a long message timeout), so every request the
    client meant to send reaches Kafka unless its delivery fails (counted apart)."""

    def __init__(self, bootstrap: str, names: TopicNames, tenants: list[str], observer: Observer,
                 *, rate: RateFn, duration_s: float, tag: str, output_tokens: int,
                 models: tuple[str, ...] = ("small",)) -> None:
        super().__init__(name="chaos-sender", daemon=True)
        self._p: Any = make_producer(bootstrap, **{"message.timeout.ms": 900_000,
                                                   "log_level": QUIET})
        self._names = names
        self._tenants = tenants
        self._obs = observer
        self._rate = rate
        self.duration_s = duration_s
        self._tag = tag
        self._out = str(output_tokens)
        self._models = models  # each round over the tenants takes the next model
        self.sent = 0
        self.failed = 0
        self._halt = threading.Event()

    def _delivered(self, err: object, _msg: object) -> None:
        if err is not None:
            self.failed += 1
            log.error("request not delivered: %s", err)

    def run(self) -> None:
        start = time.time()
        next_at = start
        while not self._halt.is_set():
            now = time.time()
            t = now - start
            if t >= self.duration_s:
                break
            if now < next_at:
                self._p.poll(min(0.02, next_at - now))
                continue
            next_at += 1.0 / max(0.1, self._rate(t))
            tenant = self._tenants[self.sent % len(self._tenants)]
            model = self._models[(self.sent // len(self._tenants)) % len(self._models)]
            self.sent += 1
            rid = f"{tenant}-{self._tag}-{self.sent}"
            req = InferenceRequest(request_id=rid, tenant=tenant, model=model,
                                   prompt_tokens=64, max_tokens=32,
                                   created_at_ms=int(now * 1000),
                                   metadata={"sim_output_tokens": self._out})
            self._obs.expect(rid, tenant, now)
            produce_waiting(self._p, self._names.requests(tenant), req.to_bytes(),
                            rid.encode(), on_delivery=self._delivered)
            self._p.poll(0)
        self._p.flush(900)

    def stop(self) -> None:
        self._halt.set()


@dataclass
class Observer:
    """Follows replies (every tenant) and completions from the beginning, on every one
    of their `partitions` (a sharded app's, kafka.admission_partitions)."""

    bootstrap: str
    names: TopicNames
    tenants: list[str]
    partitions: int = 1
    seen: dict[str, Seen] = field(default_factory=dict)
    # rid -> the distinct executions that completed it ((attempt, start) pairs): a copy
    # of one completion message is not a second execution
    completed_runs: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    gpu_lost: int = 0
    unknown: int = 0
    reply_times: list[float] = field(default_factory=list)  # the app's at_ms / 1000
    # ids outside the steady traffic (poison, a removed or added tenant's): counted apart
    side: dict[str, Seen] = field(default_factory=dict)
    # (source topic, partition, offset) -> error of each dead letter
    dead: dict[tuple[str, int, int], str] = field(default_factory=dict)
    # (topic, partition) -> the last offset this (read_committed) consumer was handed
    read_to: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._follow: list[str] = []
        self._c = make_consumer(self.bootstrap, f"{self.names.prefix}-chaos-observer",
                                log_level=QUIET)
        # one topic per tenant, or one for every tenant (kafka.tenant_topics: shared)
        self._reply_topics = {self.names.replies(t) for t in self.tenants}
        topics = [*sorted(self._reply_topics), self.names.completions]
        self._c.assign([*self._partitions(topics),
                        TopicPartition(self.names.deadletter, 0, OFFSET_BEGINNING)])
        self._thread = threading.Thread(target=self._run, name="chaos-observer", daemon=True)

    def _partitions(self, topics: list[str]) -> list[TopicPartition]:
        return [TopicPartition(t, n, OFFSET_BEGINNING) for t in topics
                for n in range(self.partitions)]

    def start(self) -> None:
        self._thread.start()

    def expect(self, rid: str, tenant: str, at: float) -> None:
        with self._lock:
            self.seen[rid] = Seen(tenant, at)

    def expect_side(self, rid: str, tenant: str, at: float) -> None:
        with self._lock:
            self.side.setdefault(rid, Seen(tenant, at))

    def follow(self, tenant: str) -> None:
        """Also read a tenant's replies (one added mid-run), from their beginning."""
        with self._lock:  # applied by the observer's own thread (the consumer's owner)
            self._follow.append(tenant)

    def _run(self) -> None:
        completions, dead = self.names.completions, self.names.deadletter
        while not self._stop.is_set():
            with self._lock:
                follow, self._follow = self._follow, []
            new = {self.names.replies(t) for t in follow} - self._reply_topics
            if new:
                self._reply_topics |= new
                self._c.incremental_assign(self._partitions(sorted(new)))
            for msg in self._c.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    continue
                self.read_to[(msg.topic() or "", msg.partition() or 0)] = msg.offset() or 0
                if msg.topic() == completions:
                    self._on_completion(msg.value() or b"")
                elif msg.topic() == dead:
                    self._on_dead(msg.value() or b"")
                else:
                    self._on_reply(msg.value() or b"", time.time())

    def _on_dead(self, value: bytes) -> None:
        try:
            d = DeadLetter.from_bytes(value)
        except ValueError:
            return
        if d.offset is not None:
            with self._lock:
                self.dead[(d.source_topic, d.partition or 0, d.offset)] = d.error

    def _on_completion(self, value: bytes) -> None:
        try:
            done = completions_in(value)
        except ValueError:
            return
        with self._lock:
            for c in done:
                if c.status is CompletionStatus.COMPLETED:
                    self.completed_runs.setdefault(c.request_id, set()).add(
                        (c.attempt, c.started_at_ms))

    def _on_reply(self, value: bytes, now: float) -> None:
        try:
            r = Reply.from_bytes(value)
        except ValueError:
            self.unknown += 1
            return
        with self._lock:
            self.reply_times.append(r.at_ms / 1000.0)
            if r.reason is not None and r.reason.value == "gpu_lost":
                self.gpu_lost += 1
            s = self.seen.get(r.request_id) or self.side.get(r.request_id)
            if s is None:
                self.unknown += 1
                return
            s.replies += 1
            if r.status.terminal:
                s.terminals += 1
                if s.terminal is None:
                    s.terminal, s.terminal_at = r.status.value, now
                    s.reason = r.reason.value if r.reason else None
                    if r.latency_ms is not None:
                        s.reported_latency_s = r.latency_ms / 1000.0

    def explain_outstanding(self, read_s: float = 20.0, show: int = 5) -> str:
        """Why requests are still unanswered, for a failed wait: what the log holds for
        them read past open transactions (read_uncommitted), and where this consumer
        stands against each partition's end. A terminal reply in the log that this
        consumer never got means a transaction still holds it back (or was aborted);
        none at all, that the app or a worker never answered."""
        with self._lock:
            pending = {rid for rid, s in self.seen.items() if s.terminal is None}
            read_to = dict(self.read_to)
            topics = sorted(self._reply_topics)
        completions = self.names.completions
        c = make_consumer(self.bootstrap, f"{self.names.prefix}-chaos-explain",
                          log_level=QUIET, **{"isolation.level": "read_uncommitted",
                                              "enable.partition.eof": True})
        last: dict[tuple[str, int], int] = {}  # the last offset in the log, transactions open
        any_reply: set[str] = set()
        terminal: set[str] = set()
        completed: set[str] = set()
        deadline = time.monotonic() + read_s
        try:
            for topic in [*topics, completions]:
                for r in scan_range(c, topic, range(self.partitions), since_ms=None,
                                    until_ms=None, deadline=deadline):
                    last[(topic, r.partition)] = r.offset
                    try:
                        if topic == completions:
                            completed |= {x.request_id for x in completions_in(r.value or b"")
                                          if x.request_id in pending}
                            continue
                        reply = Reply.from_bytes(r.value or b"")
                    except ValueError:
                        continue
                    if reply.request_id in pending:
                        any_reply.add(reply.request_id)
                        if reply.status.terminal:
                            terminal.add(reply.request_id)
        except ScanTimeoutError:
            pass  # an account of what was read in time
        finally:
            c.close()
        behind = {f"{t}[{n}]": f"read to {read_to.get((t, n), -1)} of {end + 1}"
                  for (t, n), end in sorted(last.items())
                  if end - read_to.get((t, n), -1) > 2}  # a marker or two is normal
        return (f"{len(pending)} unanswered (e.g. {sorted(pending)[:show]}); in the log "
                f"read_uncommitted: {len(terminal)} with a terminal reply "
                f"(e.g. {sorted(terminal)[:show]}), {len(any_reply)} with any reply, "
                f"{len(completed)} with a completion; partitions this read_committed "
                f"consumer lags: {behind or 'none'}")

    def outstanding(self) -> int:
        with self._lock:
            return sum(1 for s in self.seen.values() if s.terminal is None)

    def first_decision_after(self, t: float) -> float | None:
        """Seconds from `t` to the first reply the app decided after `t` (None if none)."""
        with self._lock:
            later = [x for x in self.reply_times if x > t]
        return None if not later else min(later) - t

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._c.close()
