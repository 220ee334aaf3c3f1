"""At-least-once bookkeeping of the worker: remembered work ids and committable offsets."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from triage.workers.delivery import BoundedIdSet, OffsetTracker


def test_bounded_id_set_forgets_the_oldest() -> None:
    s = BoundedIdSet(3)
    for k in "abcd":
        s.add(k)
    assert "a" not in s and all(k in s for k in "bcd") and len(s) == 3
    s.add("b")  # refreshed: now the newest
    s.add("e")
    assert "c" not in s and "b" in s


def positions(tps: list[TopicPartition]) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): tp.offset for tp in tps}


def test_commits_stop_below_the_oldest_unfinished_offset() -> None:
    t = OffsetTracker()
    for off in (10, 11, 12):
        t.received("work", 0, off)
    t.finished("work", 0, 11)
    t.finished("work", 0, 12)  # out of order: 10 still runs
    assert positions(t.committable()) == {("work", 0): 10}
    assert t.committable() == []  # nothing moved
    t.finished("work", 0, 10)
    assert positions(t.committable()) == {("work", 0): 13}
    t.received("ctl", 0, 4)
    t.finished("ctl", 0, 4)
    assert positions(t.committable()) == {("ctl", 0): 5}
    assert t.in_flight() == 0


def test_revoked_partitions_are_forgotten() -> None:
    t = OffsetTracker()
    t.received("work", 0, 1)
    t.forget([TopicPartition("work", 0)])
    assert t.committable() == [] and t.in_flight() == 0
