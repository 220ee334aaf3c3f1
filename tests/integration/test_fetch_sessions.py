"""Incremental fetch sessions (triage/streams/fetch_sessions.py) against the real broker:
an aiokafka consumer over many partitions reads every record exactly once and in order,
its fetches after the first name only the partitions that changed, and a session the
broker drops (here: forced to a stale epoch) costs one full fetch, not a record."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from triage.kafka.clients import make_admin
from triage.streams import fetch_sessions
from triage.streams.fetch_sessions import SessionFetchRequest
from triage.topics.admin import delete_topics

TOPICS = 60
RECORDS = 3000
ROUNDS = 6


def _create(bootstrap: str, names: list[str]) -> None:
    admin = make_admin(bootstrap)
    for f in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        f.result(timeout=60)


def _produce(bootstrap: str, names: list[str], start: int, n: int, rng: random.Random) -> None:
    # idempotent: a retry on a fresh topic's leader election must not reorder the log
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "enable.idempotence": True})
    for i in range(start, start + n):
        p.produce(rng.choice(names), str(i).encode())
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0


async def _read(consumer: AIOKafkaConsumer, seen: dict[str, list[int]], want: int) -> None:
    got = sum(len(v) for v in seen.values())
    for _ in range(400):  # bounded: at most ~400 polls of 100 ms
        if got >= want:
            return
        batch = await consumer.getmany(timeout_ms=100)
        for tp, records in batch.items():
            for r in records:
                seen[tp.topic].append(int(r.value))
                got += 1


async def _started(bootstrap: str, names: list[str], **fetch: Any,
                   ) -> tuple[AIOKafkaConsumer, fetch_sessions.SessionClient]:
    """A consumer of `names` from their beginning, started, its fetches in sessions."""
    consumer = AIOKafkaConsumer(
        *names, bootstrap_servers=bootstrap, group_id=names[0].split(".")[0],
        auto_offset_reset="earliest", enable_auto_commit=False, **fetch,
    )
    await consumer.start()
    client = fetch_sessions.install(consumer)
    assert client is not None
    return consumer, client


@pytest.fixture
def names(kafka_bootstrap: str) -> Iterator[list[str]]:
    """TOPICS one-partition topics under a fresh prefix, deleted after the test."""
    prefix = f"fsess-{uuid.uuid4().hex[:8]}"
    topics = [f"{prefix}.t{i}" for i in range(TOPICS)]
    _create(kafka_bootstrap, topics)
    try:
        yield topics
    finally:
        delete_topics(kafka_bootstrap, prefix)


def test_a_consumer_in_a_fetch_session_reads_every_record_once_and_names_only_changes(
    kafka_bootstrap: str, names: list[str],
) -> None:
    rng = random.Random(7)
    sizes: list[int] = []  # partitions named by each in-session request
    build = SessionFetchRequest.build

    def recording_build(self: SessionFetchRequest, cls: object) -> object:
        struct = build(self, cls)
        if self.in_session:
            sizes.append(sum(len(p) for _, p in struct.topics))
        return struct

    async def run() -> tuple[dict[str, list[int]], fetch_sessions.SessionClient]:
        consumer, client = await _started(kafka_bootstrap, names, fetch_max_wait_ms=20)
        seen: dict[str, list[int]] = defaultdict(list)
        try:
            await _read(consumer, seen, 0)
            step = RECORDS // ROUNDS
            for r in range(ROUNDS):
                if r == ROUNDS // 2:
                    for s in client.sessions.values():  # an epoch the broker never gave
                        s.epoch += 5
                await asyncio.to_thread(_produce, kafka_bootstrap, names, r * step, step, rng)
                await _read(consumer, seen, (r + 1) * step)
                await asyncio.sleep(0.1)  # idle fetches: nothing changed, nothing named
            await asyncio.sleep(0.3)  # anything sent twice would arrive now
            batch = await consumer.getmany(timeout_ms=200)
            for tp, records in batch.items():
                seen[tp.topic].extend(int(r.value) for r in records)
        finally:
            await consumer.stop()
        return seen, client

    SessionFetchRequest.build = recording_build  # type: ignore[method-assign]
    try:
        seen, client = asyncio.run(run())
    finally:
        SessionFetchRequest.build = build  # type: ignore[method-assign]

    values = [v for vs in seen.values() for v in vs]
    assert sorted(values) == list(range(RECORDS))  # every record, none twice
    for vs in seen.values():
        assert vs == sorted(vs)  # in order within each partition
    sessions = list(client.sessions.values())
    assert sum(s.incremental_fetches for s in sessions) > 20
    assert sum(s.opened for s in sessions) >= 2  # the stale epoch forced a new session
    assert sum(s.full_fetches for s in sessions) <= 6  # ... and not many more
    # a full fetch names all 60 partitions; one in a session names those whose offset
    # changed (after a round is read, most of them, once), and an idle one names none.
    # Counted over the requests, not as a share of them: idle fetches wait for the first
    # byte now (IDLE_WAIT_MS), so there are fewer of the empty ones between rounds.
    assert sum(sizes) <= 0.5 * TOPICS * len(sizes), sizes
    assert sizes.count(0) >= ROUNDS // 2, sizes


def test_an_idle_consumer_waits_for_the_first_byte_and_still_reads_every_record(
    kafka_bootstrap: str, names: list[str],
) -> None:
    """Held for 16 KB or 5 ms (the app's settings), an idle consumer sent ~200 fetches a
    second; after an empty fetch it now waits up to IDLE_WAIT_MS for the first byte. A
    second of idleness is counted in fetches (at most ~1/IDLE_WAIT_MS of them, a fifth of
    what 5 ms holds send, with room for a slow machine), and the records produced after
    it are all read, once each."""
    rng = random.Random(11)

    async def run() -> tuple[list[int], int, int]:
        consumer, _client = await _started(kafka_bootstrap, names, fetch_max_wait_ms=5,
                                           fetch_min_bytes=16384)
        seen: dict[str, list[int]] = defaultdict(list)
        try:
            await _read(consumer, seen, 0)
            reading = asyncio.ensure_future(_read(consumer, seen, 200))  # a reader waiting
            sent = fetch_sessions.SENT
            fetches, waits = sent.full + sent.incremental, sent.long_waits
            await asyncio.sleep(1.0)
            idle_fetches = sent.full + sent.incremental - fetches
            long_waits = sent.long_waits - waits
            await asyncio.to_thread(_produce, kafka_bootstrap, names, 0, 200, rng)
            await reading
        finally:
            await consumer.stop()
        return [v for vs in seen.values() for v in vs], idle_fetches, long_waits

    values, idle_fetches, long_waits = asyncio.run(run())
    assert sorted(values) == list(range(200))  # every record, none twice
    assert idle_fetches <= 1000 // fetch_sessions.IDLE_WAIT_MS * 4, idle_fetches
    assert long_waits >= 3, long_waits
