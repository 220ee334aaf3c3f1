"""Faust's consumer-thread commit, as patched by faust_fixes.commit_against_one_assignment:
the assignment is read once per commit (Faust read it once per offset, each time building
a set of every assigned partition), and offsets of partitions not assigned are still
left out."""

from __future__ import annotations

import asyncio
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from triage.streams import faust_fixes


class _Consumer:
    def __init__(self) -> None:
        self.committed: dict[Any, Any] = {}

    async def commit(self, offsets: dict[Any, Any]) -> None:
        self.committed.update(offsets)


def test_a_commit_reads_the_assignment_once_and_commits_only_assigned_partitions() -> None:
    faust_fixes.commit_against_one_assignment()
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    assigned = {TP(f"t{i}", 0) for i in range(100)}
    calls = [0]
    consumer = _Consumer()

    class Thread:
        tp_last_committed_at: dict[Any, float] = {}

        def assignment(self) -> set[TP]:
            calls[0] += 1
            return set(assigned)

        def _ensure_consumer(self) -> _Consumer:
            return consumer

    offsets = {TP(f"t{i}", 0): i for i in range(0, 150, 3)}  # 50 offsets, 34 assigned
    commit = cls._triage_commit_once_assigned  # under any wrapper installed since
    ok = asyncio.run(commit(Thread(), offsets))
    assert ok
    assert calls[0] == 1
    assert {(tp.topic, m.offset) for tp, m in consumer.committed.items()} == {
        (f"t{i}", i) for i in range(0, 100, 3)}


def test_highwater_of_a_partition_revoked_by_a_resubscription_is_unknown_not_a_crash() -> None:
    """The CI crash of the chaos `config` scenario: the consumer thread resubscribed
    (a tenant removed) while the main loop still delivered a batch; aiokafka's
    `highwater` asserted the partition was assigned and the app exited."""
    from aiokafka.consumer.consumer import AIOKafkaConsumer
    from aiokafka.consumer.subscription_state import SubscriptionState
    from aiokafka.structs import TopicPartition

    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    original = cls.highwater
    faust_fixes.highwater_while_resubscribing()
    tp = TopicPartition("requests", 0)

    async def scenario() -> list[Any]:
        state = SubscriptionState()
        state.subscribe(topics={"requests"})
        state.assign_from_subscribed({tp})
        state.subscription.assignment.state_value(tp).highwater = 42

        class Consumer:
            _subscription = state
            highwater = AIOKafkaConsumer.highwater

        class Thread:
            consumer = type("Faust", (), {"in_transaction": False})()

            def _ensure_consumer(self) -> Any:
                return Consumer()

        thread = Thread()
        seen = [cls.highwater(thread, tp)]
        state.subscribe(topics={"requests", "replies.new-tenant"})  # the thread resubscribes
        seen.append(cls.highwater(thread, tp))
        try:
            original(thread, tp)
        except AssertionError as exc:
            seen.append(str(exc))
        return seen

    assert asyncio.run(scenario()) == [42, None, "Partition is not assigned"]
