"""The ceilings `triage bench pipeline` measures triage against, on the same broker:

- the broker's: confluent-kafka produce (idempotent, acks=all: the project's producer
  settings) of ~340 B request-like JSON messages, then a consume of the same messages;
- the Faust engine's: the ceiling apps (ceiling_app.py), each a child process, offered
  messages flat out; their rate is that of their last outputs, their CPU read from
  /proc while they work.

A Faust ceiling's rate, like triage's (pipeline.py), is its outputs counted from the moment
the first input was offered to the last output's own timestamp: a pipeline that fills
(requests first, completions after) cannot look faster than it is.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from triage.bench.batcher import WorkBatcher
from triage.bench.ceiling_app import CeilingKind, CeilingTopics
from triage.bench.children import BenchStartError, Fleet, cpu_seconds
from triage.config.models import WorkerConfig
from triage.demo.processes import ChildProcess
from triage.kafka.clients import make_consumer, make_producer, produce_waiting
from triage.topics.admin import TopicSpec, ensure_topics
from triage.topics.messages import InferenceRequest
from triage.topics.names import TopicKind

PROMPT = "x" * 150  # brings a request to ~340 bytes of JSON
WARM_KEY = b"warm"
READY_S = 180.0  # a ceiling app's start on a loaded 2-core machine


def request_bytes(rid: str, tenant: str, model: str, now_ms: int) -> bytes:
    """A small InferenceRequest (~340 B): what every phase of the bench sends."""
    return InferenceRequest(
        request_id=rid, tenant=tenant, model=model, prompt_tokens=32, max_tokens=4,
        created_at_ms=now_ms, prompt=PROMPT, metadata={"sim_output_tokens": "2"},
    ).to_bytes()


def _payloads(n: int, tag: str) -> list[tuple[bytes, bytes]]:
    """Keys and values built before any clock starts (pydantic is not what is timed)."""
    template = request_bytes("RID", "t0", "tiny", int(time.time() * 1000))
    return [(f"{tag}-{i}".encode(), template.replace(b'"RID"', f'"{tag}-{i}"'.encode()))
            for i in range(n)]


def _produce_all(bootstrap: str, topic: str, msgs: list[tuple[bytes, bytes]]) -> float:
    """Produce flat out and flush; returns the seconds from the first produce to the
    last acknowledgement. Delivery errors fail the run (a ceiling with losses is none)."""
    errors: list[str] = []

    def report(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    p = make_producer(bootstrap, **{"linger.ms": 5, "delivery.report.only.error": True})
    p.list_topics(topic, timeout=10)  # connected, with metadata, before the clock starts
    start = time.perf_counter()
    for i, (key, value) in enumerate(msgs):
        produce_waiting(p, topic, value, key, on_delivery=report, backoff_s=0.01)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(60)
    elapsed = time.perf_counter() - start
    if left or errors:
        raise BenchStartError(f"producing to {topic}: {left} unsent, {len(errors)} failed "
                              f"({errors[0] if errors else 'timeout'})")
    return elapsed


def broker_ceiling(bootstrap: str, topic: str, n: int) -> dict[str, float]:
    """Messages/s produced, then consumed, on one fresh single-partition topic."""
    ensure_topics(bootstrap, [TopicSpec(topic, TopicKind.ADMISSION, 1, 1)])
    produce_s = _produce_all(bootstrap, topic, _payloads(n, "b"))
    c = make_consumer(bootstrap, f"{topic}.reader")
    tp = TopicPartition(topic, 0, OFFSET_BEGINNING)
    got = 0
    deadline = time.monotonic() + 120
    try:
        c.get_watermark_offsets(tp, timeout=10)  # connected before the clock starts
        c.assign([tp])
        start = time.perf_counter()
        while got < n and time.monotonic() < deadline:
            got += sum(1 for m in c.consume(num_messages=10_000, timeout=0.5)
                       if m.error() is None)
        last = time.perf_counter()
    finally:
        c.close()
    if got < n:
        raise BenchStartError(f"read {got} of {n} messages back from {topic}")
    return {"produce_per_s": n / produce_s, "consume_per_s": n / max(1e-9, last - start)}


class OutputCounter:
    """Counts the messages on one topic (read committed) whose key starts with `tag`,
    with the last of their timestamps; sees the warm-up key too."""

    def __init__(self, bootstrap: str, topic: str, tag: bytes) -> None:
        self._c = make_consumer(bootstrap, f"{topic}.counter")
        self._c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self._tag = tag
        self.count = 0
        self.warm = False
        self.last_ms = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"count-{topic}")
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self._c.consume(num_messages=5000, timeout=0.2):
                if m.error() is not None:
                    continue
                key = m.key() or b""
                if key.startswith(self._tag):
                    self.last_ms = max(self.last_ms, m.timestamp()[1])
                    self.count += 1
                elif key == WARM_KEY:
                    self.warm = True

    def rate(self, since_ms: int) -> float:
        """Counted outputs per second from `since_ms` (a span under 1 ms counts as 1)."""
        return self.count / (max(1, self.last_ms - since_ms) / 1000.0)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)
        self._c.close()


def faust_ceiling(fleet: Fleet, *, kind: CeilingKind, bootstrap: str, config_path: Path,
                  base: str, n: int, run_dir: Path, queued_share: float = 0.0,
                  worker: WorkerConfig | None = None) -> dict[str, float]:
    """Start the ceiling app, warm it up with one message, offer `n` flat out, and wait
    for their last outputs. Returns requests (or messages) per second and CPU µs each.
    The matched skeleton takes triage's `queued_share`, and its batcher the `worker`
    settings (ceiling_app.py)."""
    topics = CeilingTopics(base)
    ensure_topics(bootstrap, [TopicSpec(t, TopicKind.ADMISSION, 1, 1) for t in topics.all()])
    counter = OutputCounter(bootstrap, topics.out, b"m-")
    matched = kind is CeilingKind.MATCHED
    child = ChildProcess(f"ceiling-{kind}", [
        "bench", "ceiling-app", "--config", str(config_path), "--kind", kind.value,
        "--base", base, "--datadir", str(run_dir / f"{base}-data"),
        *(["--queued-share", repr(queued_share)] if matched else []),
    ], run_dir / f"{base}.log")
    batcher: WorkBatcher | None = None
    try:
        if matched:
            w = worker or WorkerConfig()
            batcher = WorkBatcher(bootstrap, topics.work, topics.done,
                                  max_items=w.completion_batch_max,
                                  linger_s=w.completion_linger_ms / 1000)
        fleet.start(child)
        assert child.proc is not None
        deadline = time.monotonic() + READY_S
        while not counter.warm:  # one warm-up message until its output comes back
            if not child.alive() or time.monotonic() > deadline:
                raise BenchStartError(f"ceiling app {kind} did not start: "
                                      f"{_last_line(child)}")
            _produce_all(bootstrap, topics.inputs, [(WARM_KEY, request_bytes(
                "warm", "t0", "tiny", int(time.time() * 1000)))])
            for _ in range(20):
                if counter.warm:
                    break
                time.sleep(0.1)
        payloads = _payloads(n, "m")
        cpu0 = cpu_seconds(child.proc.pid)
        start_ms = int(time.time() * 1000)
        _produce_all(bootstrap, topics.inputs, payloads)
        _wait_for(counter, n, child, timeout_s=60 + n / 50)
        cpu_s = cpu_seconds(child.proc.pid) - cpu0
        out = {"per_s": counter.rate(start_ms), "cpu_us": cpu_s / n * 1e6}
        if batcher is not None:
            out["items_per_message"] = batcher.items / max(1, batcher.messages)
        return out
    finally:
        if batcher is not None:
            batcher.stop()
        counter.stop()
        fleet.stop(child)


def _wait_for(counter: OutputCounter, n: int, child: ChildProcess, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while counter.count < n:
        if not child.alive():
            raise BenchStartError(f"ceiling app {child.name} exited: {_last_line(child)}")
        if time.monotonic() > deadline:
            raise BenchStartError(f"{child.name}: {counter.count} of {n} outputs after "
                                  f"{timeout_s:.0f} s")
        time.sleep(0.05)


def _last_line(child: ChildProcess) -> str:
    lines = [ln for ln in child.tail(20).splitlines() if ln.strip()]
    return lines[-1] if lines else f"no output (see {child.log_path})"
