"""Drive tenants' traffic at the admission app in wall time and follow every reply.

The arrivals come from a simulator scenario (the same generators `triage sim` uses),
paced against the wall clock; each request carries the output length the simulated
GPU should produce. A consumer thread follows every tenant's reply topic and keeps,
per request, what it was told and when: enough to prove each request ended in
exactly one terminal reply, and to measure latency as the tenant sees it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from triage.kafka.clients import make_consumer, make_producer
from triage.sim.workload import Arrival
from triage.topics.messages import InferenceRequest, Reply
from triage.topics.names import TopicNames

log = logging.getLogger(__name__)


@dataclass
class Track:
    """One request as its tenant saw it."""

    tenant: str
    sent_at: float
    statuses: list[str] = field(default_factory=list)
    terminal: str | None = None
    terminal_at: float | None = None
    terminals: int = 0
    reason: str | None = None
    retry_after_ms: int | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.terminal_at is None else self.terminal_at - self.sent_at


class ReplyTracker:
    """Follows the reply topics of the given tenants from their beginning."""

    def __init__(self, bootstrap: str, names: TopicNames, tenants: Iterable[str]) -> None:
        self._consumer = make_consumer(bootstrap, f"{names.prefix}-demo-replies",
                                       **{"enable.partition.eof": False})
        topics = [names.replies(t) for t in tenants]
        md = self._consumer.list_topics(timeout=10.0)
        self._consumer.assign([
            TopicPartition(t, p, OFFSET_BEGINNING)
            for t in topics for p in md.topics[t].partitions
        ])
        self.tracks: dict[str, Track] = {}
        self.unknown = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reply-tracker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def expect(self, request_id: str, tenant: str, sent_at: float) -> None:
        with self._lock:
            self.tracks[request_id] = Track(tenant, sent_at)

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    continue
                now = time.time()
                try:
                    reply = Reply.from_bytes(msg.value() or b"")
                except ValueError:
                    self.unknown += 1
                    continue
                with self._lock:
                    t = self.tracks.get(reply.request_id)
                    if t is None:
                        self.unknown += 1
                        continue
                    t.statuses.append(reply.status.value)
                    if reply.status.terminal:
                        t.terminals += 1
                        if t.terminal is None:
                            t.terminal, t.terminal_at = reply.status.value, now
                            t.reason = reply.reason.value if reply.reason else None
                            t.retry_after_ms = reply.retry_after_ms

    def outstanding(self) -> int:
        with self._lock:
            return sum(1 for t in self.tracks.values() if t.terminal is None)

    def snapshot(self) -> list[Track]:
        with self._lock:
            return [Track(t.tenant, t.sent_at, list(t.statuses), t.terminal, t.terminal_at,
                          t.terminals, t.reason, t.retry_after_ms) for t in self.tracks.values()]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()


class LoadDriver:
    """Sends arrivals at their times (scaled by `speed`), as the tenants would."""

    def __init__(self, bootstrap: str, names: TopicNames, tracker: ReplyTracker) -> None:
        self._producer: Any = make_producer(bootstrap)
        self._names = names
        self._tracker = tracker
        self.sent = 0

    def close(self) -> None:
        """Flush and destroy the producer now (before a broker it talks to goes away,
        or librdkafka keeps logging reconnect failures until garbage collection)."""
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

    def run(
        self, arrivals: Iterable[Arrival], *, speed: float = 1.0,
        on_progress: Callable[[float, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> int:
        start = time.time()
        last_report = 0.0
        for a in arrivals:
            due = start + a.t / speed
            while True:
                now = time.time()
                if now >= due:
                    break
                self._producer.poll(min(0.05, due - now))
                if on_progress is not None and now - last_report > 0.25:
                    on_progress(now - start, self.sent)
                    last_report = now
            if should_stop is not None and should_stop():
                break
            self.sent += 1
            rid = f"{a.tenant}-{self.sent}"
            req = InferenceRequest(
                request_id=rid, tenant=a.tenant, model=a.model, prompt_tokens=a.prompt_tokens,
                max_tokens=a.max_tokens, created_at_ms=int(time.time() * 1000),
                sla_ms=None if a.sla_s is None else int(a.sla_s * 1000),
                metadata={"sim_output_tokens": str(a.output_tokens)},
            )
            self._tracker.expect(rid, a.tenant, time.time())
            self._producer.produce(self._names.requests(a.tenant), key=rid.encode(),
                                   value=req.to_bytes())
            self._producer.poll(0)
        self._producer.flush(30)
        if on_progress is not None:
            on_progress(time.time() - start, self.sent)
        return self.sent
