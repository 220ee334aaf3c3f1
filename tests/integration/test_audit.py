"""`triage audit` against the real broker: DecisionRecords produced to the decisions topic.

Also pins down the fact behind two designs: librdkafka's default partitioner is
not Java's murmur2, so our producers set murmur2 (keys co-partition with Faust's
aiokafka), and since any other writer may still differ, the reader scans every
partition.
"""

from __future__ import annotations

import json
import time
import zlib

import pytest
from confluent_kafka import Message, Producer
from typer.testing import CliRunner

from triage.audit import Explanation, explain, read_decisions
from triage.cli.main import app
from triage.kafka.clients import make_producer
from triage.topics.admin import TopicSpec, ensure_topics
from triage.topics.messages import DecisionInputs, DecisionRecord
from triage.topics.names import TopicKind, TopicNames
from triage.topics.reasons import Outcome, ReasonCode

pytestmark = pytest.mark.broker

PARTITIONS = 3
GIB = 1024**3


def now_ms() -> int:
    return int(time.time() * 1000)


def decision(rid: str, outcome: Outcome, reason: ReasonCode, **kw: object) -> DecisionRecord:
    data: dict[str, object] = {
        "request_id": rid,
        "tenant": "rag",
        "model": "llama-3.1-8b",
        "pool": "shared",
        "outcome": outcome,
        "reason": reason,
        "policy": "full",
        "policy_version": "1",
        "at_ms": now_ms(),
    }
    data.update(kw)
    return DecisionRecord.model_validate(data)


def produce(
    producer: Producer, topic: str, rec: DecisionRecord, partition: int | None = None
) -> int:
    """Produce keyed by request id; return the partition it landed on."""
    landed: list[int] = []

    def on_delivery(err: object, msg: Message) -> None:
        assert err is None, err
        landed.append(msg.partition() or 0)

    key, value = rec.request_id.encode(), rec.to_bytes()
    if partition is None:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    else:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery, partition=partition)
    producer.flush(10)
    return landed[0]


@pytest.fixture
def decisions_topic(kafka_bootstrap: str, topic_names: TopicNames) -> str:
    topic = topic_names.decisions
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, TopicKind.DECISIONS, PARTITIONS, 1)])
    return topic


@pytest.fixture
def populated(kafka_bootstrap: str, decisions_topic: str) -> dict[str, int]:
    """rag-1 rejected over quota; rag-2 queued on one partition, timed out on another;
    rag-10 (an id containing rag-1) admitted; and a garbage message."""
    p = make_producer(kafka_bootstrap)
    quota = DecisionInputs(
        request_tokens=2_400, bucket_level=310, bucket_burst=30_000, bucket_debt_ceiling=0
    )
    landed = {
        "rag-1": produce(p, decisions_topic, decision(
            "rag-1", Outcome.REJECT, ReasonCode.TENANT_QUOTA_EXCEEDED,
            retry_after_ms=1_200, inputs=quota,
        )),
        "rag-10": produce(
            p, decisions_topic, decision("rag-10", Outcome.ACCEPT, ReasonCode.ADMITTED)
        ),
    }  # fmt: skip
    queued = decision(
        "rag-2", Outcome.QUEUE, ReasonCode.GPU_MEMORY_INSUFFICIENT,
        inputs=DecisionInputs(kv_bytes_needed=3 * GIB, kv_bytes_available=GIB, queue_position=4,
                              queue_depth=9),
    )  # fmt: skip
    first = produce(p, decisions_topic, queued)
    timed_out = decision(
        "rag-2", Outcome.TIMEOUT, ReasonCode.QUEUE_TIMEOUT,
        at_ms=queued.at_ms + 1_500, queue_wait_ms=1_500, retry_after_ms=2_000,
    )  # fmt: skip
    # another writer placed the same key elsewhere (different partitioner, or more partitions)
    landed["rag-2"] = produce(p, decisions_topic, timed_out, partition=(first + 1) % PARTITIONS)
    p.produce(decisions_topic, key=b"rag-1", value=b"not a decision rag-1")
    p.flush(10)
    return landed


def test_reader_finds_one_requests_decisions_across_partitions(
    kafka_bootstrap: str, decisions_topic: str, populated: dict[str, int]
) -> None:
    scan = read_decisions(bootstrap=kafka_bootstrap, topic=decisions_topic, request_id="rag-2")
    assert scan.complete and scan.partitions == PARTITIONS
    assert [r.outcome for r in scan.records] == [Outcome.QUEUE, Outcome.TIMEOUT]
    e = explain(scan.records)
    assert e.reason == ReasonCode.QUEUE_TIMEOUT
    assert "3.0 GiB" in e.steps[0].sentence

    scan = read_decisions(bootstrap=kafka_bootstrap, topic=decisions_topic, request_id="rag-1")
    assert [r.request_id for r in scan.records] == ["rag-1"]  # not rag-10
    assert scan.unparseable == 1  # the garbage message mentioning rag-1
    assert scan.scanned == 5


def test_since_bounds_the_scan(
    kafka_bootstrap: str, decisions_topic: str, populated: dict[str, int]
) -> None:
    later = read_decisions(
        bootstrap=kafka_bootstrap, topic=decisions_topic, request_id="rag-1",
        since_ms=now_ms() + 3_600_000,
    )  # fmt: skip
    assert later.records == [] and later.scanned == 0
    recent = read_decisions(
        bootstrap=kafka_bootstrap, topic=decisions_topic, request_id="rag-1",
        since_ms=now_ms() - 600_000,
    )  # fmt: skip
    assert len(recent.records) == 1


def test_cli_explains_a_rejection(
    kafka_bootstrap: str, topic_names: TopicNames, populated: dict[str, int]
) -> None:
    runner = CliRunner()
    where = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topic_names.prefix]
    res = runner.invoke(app, ["audit", "rag-1", *where])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())  # rich wraps lines
    assert "Rejected" in text
    assert "over quota" in text
    assert "2,400 tokens" in text and "310 tokens" in text
    assert "retry in 1.2 s" in text

    res = runner.invoke(app, ["audit", "rag-1", *where, "--json"])
    assert res.exit_code == 0, res.output
    e = Explanation.from_json(res.stdout)
    assert (e.outcome, e.reason, e.retry_after_ms) == (
        Outcome.REJECT, ReasonCode.TENANT_QUOTA_EXCEEDED, 1_200,
    )  # fmt: skip
    assert json.loads(res.stdout)["steps"][0]["record"]["inputs"]["bucket_level"] == 310

    missing = runner.invoke(app, ["audit", "rag-404", *where])
    assert missing.exit_code == 1
    assert "no decisions recorded for request rag-404" in " ".join(missing.stderr.split())

    no_topic = runner.invoke(
        app, ["audit", "rag-1", "--bootstrap", kafka_bootstrap, "--topic-prefix", "nosuchprefix"]
    )
    assert no_topic.exit_code == 3


def _java_murmur2(data: bytes) -> int:
    """Kafka's Java DefaultPartitioner hash (Utils.murmur2), as a positive int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length - length % 4 :]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h & 0x7FFFFFFF


def test_our_producers_place_keys_like_java_and_librdkafkas_default_does_not(
    kafka_bootstrap: str, decisions_topic: str
) -> None:
    """Why triage's producers set murmur2, and why the reader scans every partition."""
    keys = [f"req-{i}" for i in range(40)]
    ours = make_producer(kafka_bootstrap)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})  # librdkafka's own default
    rec = decision("x-1", Outcome.ACCEPT, ReasonCode.ADMITTED)
    got_ours, got_plain = {}, {}
    for k in keys:
        r = rec.model_copy(update={"request_id": k})
        got_ours[k] = produce(ours, decisions_topic, r)
        got_plain[k] = produce(plain, decisions_topic, r)
    assert got_ours == {k: _java_murmur2(k.encode()) % PARTITIONS for k in keys}
    assert got_plain == {k: zlib.crc32(k.encode()) % PARTITIONS for k in keys}
    assert got_plain != got_ours  # two writers can disagree about where a key lives
