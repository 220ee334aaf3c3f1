"""produce_waiting: a full local queue is waited out, never dropped or raised."""

from __future__ import annotations

from typing import Any

from triage.kafka.clients import produce_waiting


class FullThenFree:
    """A producer whose queue is full for the first `full` calls (as librdkafka's
    produce() raises BufferError), recording what it accepted and how it was polled."""

    def __init__(self, full: int) -> None:
        self.full = full
        self.accepted: list[tuple[str, Any, Any, int, Any]] = []
        self.polls: list[float] = []

    def produce(self, topic: str, *, value: Any, key: Any, partition: int,
                on_delivery: Any, headers: Any) -> None:
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.accepted.append((topic, key, value, partition, headers))

    def poll(self, timeout: float) -> int:
        self.polls.append(timeout)
        return 0


def test_a_full_queue_is_polled_until_the_message_is_accepted_once() -> None:
    p = FullThenFree(full=3)
    produce_waiting(p, "t", b"v", b"k", 2, headers=[("h", b"1")], backoff_s=0.01)  # type: ignore[arg-type]
    assert p.accepted == [("t", b"k", b"v", 2, [("h", b"1")])]
    assert p.polls == [0.01, 0.01, 0.01]


def test_a_free_queue_is_not_polled() -> None:
    p = FullThenFree(full=0)
    produce_waiting(p, "t", b"v")  # type: ignore[arg-type]
    assert p.accepted == [("t", None, b"v", -1, None)] and p.polls == []
