"""The matched skeleton's stand-in for the workers' completion batching
(workers/batching.py): it reads the skeleton's work items and sends them back a few to
a message, as JSON lists, so the skeleton pays one event per message as triage does
per CompletionBatch. It runs as a thread of the bench's process, as the workers run
beside the admission app in triage's phase, and with their settings
(`worker.completion_batch_max`, `worker.completion_linger_ms`)."""

from __future__ import annotations

import threading
import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from triage.kafka.clients import make_consumer, make_producer, produce_waiting


def batch_bytes(values: list[bytes]) -> bytes:
    """One message of work items: their JSON objects as one JSON list."""
    return b"[" + b",".join(values) + b"]"


class WorkBatcher:
    """Work items of `work` (one partition) back onto `done`, up to `max_items` a message;
    a partial batch goes once its first item has waited `linger_s`."""

    def __init__(self, bootstrap: str, work: str, done: str, *, max_items: int,
                 linger_s: float) -> None:
        self._c = make_consumer(bootstrap, f"{work}.batcher")
        self._c.assign([TopicPartition(work, 0, OFFSET_BEGINNING)])
        self._p = make_producer(bootstrap, **{"linger.ms": 1})
        self._done = done
        self._max = max_items
        self._linger_s = linger_s
        self.messages = 0
        self.items = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"batch-{work}")
        self._t.start()

    def _send(self, values: list[bytes]) -> None:
        produce_waiting(self._p, self._done, batch_bytes(values), None, backoff_s=0.005)
        self._p.poll(0)
        self.messages += 1
        self.items += len(values)

    def _run(self) -> None:
        held: list[bytes] = []
        since = 0.0
        while not self._stop.is_set():
            wait = self._linger_s - (time.monotonic() - since) if held else 0.1
            for m in self._c.consume(num_messages=self._max, timeout=max(0.0, wait)):
                if m.error() is not None or m.value() is None:
                    continue
                if not held:
                    since = time.monotonic()
                held.append(m.value())  # type: ignore[arg-type]
                if len(held) >= self._max:
                    self._send(held)
                    held = []
            if held and time.monotonic() - since >= self._linger_s:
                self._send(held)
                held = []
        self._p.flush(10)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)
        self._c.close()
