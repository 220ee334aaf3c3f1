"""The tables' changelog writer (streams/changelog.py) against real Kafka and a real
RocksDB store of a Faust table: what Faust's ManagedUserDict hands the table's
on_key_set/on_key_del reaches the changelog topic in order (a delete as a tombstone),
the table's RocksDB remembers the last offset delivered (so a restart reads only the
changelog's tail), and a write librdkafka gives up is an error, never a silent loss."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import faust
import pytest
from confluent_kafka.admin import NewTopic
from faust.types import TP

from tests.integration._reading import read_partition
from triage.kafka.clients import make_admin
from triage.streams.changelog import ChangelogLostError, ChangelogProducer
from triage.streams.engine import raw_table


def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, int]]:
    return [(m.key(), m.value(), int(m.offset() or 0)) for m in read_partition(bootstrap, topic)]


def _table(tmp_path: Path, bootstrap: str, changelog: ChangelogProducer,
           create: bool = True) -> tuple[Any, str]:
    """A Faust table writing through `changelog`; its changelog topic created unless not
    `create` (the broker does not create topics on first use: writes then wait)."""
    app_id = f"t{uuid.uuid4().hex[:8]}"
    app = faust.App(app_id, broker=f"kafka://{bootstrap}", store="rocksdb://",
                    datadir=str(tmp_path / app_id), web_enabled=False)
    table = raw_table(app, "records", changelog)
    topic = table.changelog_topic.get_topic_name()
    if create:
        admin = make_admin(bootstrap)
        for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            f.result(timeout=30)
    return table, topic


def test_writes_reach_the_changelog_in_order_and_the_last_offset_is_persisted(
    kafka_bootstrap: str, tmp_path: Path,
) -> None:
    changelog = ChangelogProducer(kafka_bootstrap)
    t, topic = _table(tmp_path, kafka_bootstrap, changelog)
    t.on_key_set(b"a", b"1")
    t.on_key_set(b"b", b"2")
    t.on_key_set(b"a", b"3")
    t.on_key_del(b"b")
    assert changelog.pending() == 4  # delivery reports are served by flush
    assert changelog.flush(30.0)
    assert changelog.pending() == 0
    tp = TP(topic, 0)
    assert t.data.persisted_offset(tp) is None  # not until the loop's thread records it
    changelog.persist_offsets()
    records = _read_all(kafka_bootstrap, topic)
    assert [(k, v) for k, v, _ in records] == [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"),
                                               (b"b", None)]
    assert t.data.persisted_offset(tp) == records[-1][2]
    t.on_key_set(b"c", b"4")
    assert changelog.flush(30.0)
    changelog.persist_offsets()
    assert t.data.persisted_offset(tp) == records[-1][2] + 1


def test_a_write_librdkafka_gives_up_is_an_error(tmp_path: Path, kafka_bootstrap: str) -> None:
    # a port nothing listens on: the write can never be delivered
    dead = ChangelogProducer("127.0.0.1:9", message_timeout_ms=1_000)
    changelog = ChangelogProducer(kafka_bootstrap)
    t, _topic = _table(tmp_path, kafka_bootstrap, changelog)
    dead.attach(t)
    t.on_key_set(b"a", b"1")
    with pytest.raises(ChangelogLostError, match="not delivered"):
        for _ in range(10):  # the message times out after 1 s
            dead.flush(1.0)


def test_a_flush_waits_for_the_writes_before_its_mark_not_for_later_ones(
    kafka_bootstrap: str, tmp_path: Path,
) -> None:
    """The committer's flush of a batch (mark, then settle) ends once that batch's writes
    are delivered, while a write made after the mark is still undelivered: here one to a
    changelog topic that does not exist yet, which librdkafka holds until it gives up."""
    changelog = ChangelogProducer(kafka_bootstrap, message_timeout_ms=3_000)
    t, topic = _table(tmp_path, kafka_bootstrap, changelog)
    later, _missing = _table(tmp_path, kafka_bootstrap, changelog, create=False)
    t.on_key_set(b"a", b"1")
    t.on_key_set(b"b", b"2")
    upto = changelog.mark()
    later.on_key_set(b"x", b"held")
    deadline = time.monotonic() + 30.0
    while not changelog.settle(upto, wait_s=0.05):
        assert time.monotonic() < deadline, "the batch's own writes were never delivered"
    assert changelog.pending() == 1  # the later write: not waited for
    changelog.persist_offsets()
    assert t.data.persisted_offset(TP(topic, 0)) == 1
    with pytest.raises(ChangelogLostError, match="not delivered"):
        changelog.flush(30.0)  # waits for everything, the held write too: it is given up
