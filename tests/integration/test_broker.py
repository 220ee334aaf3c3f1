"""The local broker, topic creation and a confluent-kafka round trip, against real Kafka."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import TopicPartition
from confluent_kafka.admin import ConfigResource
from typer.testing import CliRunner

from triage.cli.main import app
from triage.config import EXAMPLE_CONFIG, TriageConfig
from triage.kafka.clients import make_admin, make_consumer, make_producer
from triage.kafka.local import KAFKA_VERSION, ForeignBrokerError, LocalBroker
from triage.ports import free_run
from triage.topics.admin import create_topics, describe_topics, topic_layout
from triage.topics.messages import InferenceRequest
from triage.topics.names import TopicKind, TopicNames

runner = CliRunner()


def _flat(text: str) -> str:
    """Rich wraps long lines at 80 columns under CliRunner: compare text, not layout."""
    return " ".join(text.split())


def _port(bootstrap: str) -> int:
    return int(bootstrap.rsplit(":", 1)[1])


def test_kafka_status_json_reports_reachable_broker(kafka_bootstrap: str) -> None:
    result = runner.invoke(
        app, ["kafka", "status", "--json", "--port", str(_port(kafka_bootstrap))]
    )
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["reachable"] is True
    assert status["bootstrap"].endswith(f":{_port(kafka_bootstrap)}")
    if status["managed"]:  # our broker: we know its version, pid and log
        assert status["version"] == KAFKA_VERSION
        assert isinstance(status["pid"], int)
        assert status["log_path"].endswith("server.log")


def test_kafka_status_on_a_free_port_says_not_running(tmp_path: Path) -> None:
    result = runner.invoke(app, ["kafka", "status", "--port", "1", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "not running" in _flat(result.stdout)


def test_up_on_a_port_served_by_another_broker_is_reported(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # Same port, different data dir: this LocalBroker did not start what answers there.
    broker = LocalBroker(port=_port(kafka_bootstrap), data_dir=str(tmp_path))
    with pytest.raises(ForeignBrokerError, match="did not start"):
        broker.start()
    assert broker.stop() is False  # never stops what it did not start
    result = runner.invoke(
        app, ["kafka", "up", "--port", str(_port(kafka_bootstrap)), "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 0
    assert "did not start" in _flat(result.output)


def _topic_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    admin = make_admin(bootstrap)
    res = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in names]
    out: dict[str, dict[str, str]] = {}
    for r, fut in admin.describe_configs(res, request_timeout=30).items():
        out[r.name] = {k: v.value for k, v in fut.result().items()}
    return out


def test_topic_creation_is_idempotent_with_configured_layout(
    kafka_bootstrap: str, topic_names: TopicNames, triage_config: TriageConfig
) -> None:
    cfg = triage_config.model_copy(
        update={
            "kafka": triage_config.kafka.model_copy(
                update={"request_partitions": 3, "admission_partitions": 2}
            )
        }
    )
    layout = {s.name: s for s in topic_layout(cfg, topic_names)}
    first = create_topics(kafka_bootstrap, topic_names, cfg)
    assert sorted(first.created) == sorted(layout)
    assert first.existing == []

    second = create_topics(kafka_bootstrap, topic_names, cfg)
    assert second.created == []
    assert sorted(e.name for e in second.existing) == sorted(layout)
    assert all(e.mismatch is None for e in second.existing)

    on_broker = {i.name: i for i in describe_topics(kafka_bootstrap, topic_names.prefix)}
    assert set(on_broker) == set(layout)
    for name, spec in layout.items():
        assert on_broker[name].partitions == spec.partitions, name
    assert on_broker[topic_names.requests("rag")].partitions == 3
    assert on_broker[topic_names.admission].partitions == 2
    assert on_broker[topic_names.completions].partitions == 2  # co-partitioned with admission
    assert on_broker[topic_names.gpu_status].cleanup_policy == "compact"
    assert on_broker[topic_names.decisions].retention_ms == str(cfg.kafka.decisions_retention_ms)
    assert on_broker[topic_names.requests("rag")].retention_ms == str(
        cfg.kafka.default_retention_ms
    )
    configs = _topic_configs(kafka_bootstrap, [topic_names.gpu_status])
    assert configs[topic_names.gpu_status]["cleanup.policy"] == "compact"


def test_existing_topic_with_other_partitions_is_left_alone_and_reported(
    kafka_bootstrap: str, topic_names: TopicNames, triage_config: TriageConfig
) -> None:
    create_topics(kafka_bootstrap, topic_names, triage_config)
    more = triage_config.model_copy(
        update={"kafka": triage_config.kafka.model_copy(update={"request_partitions": 4})}
    )
    result = create_topics(kafka_bootstrap, topic_names, more)
    assert result.created == []
    by_name = {e.name: e for e in result.existing}
    rag = by_name[topic_names.requests("rag")]
    assert rag.partitions == 1
    assert rag.mismatch is not None and "4" in rag.mismatch
    still = {i.name: i for i in describe_topics(kafka_bootstrap, topic_names.prefix)}
    assert still[topic_names.requests("rag")].partitions == 1


def test_layout_covers_every_tenant_gpu_and_kind(
    triage_config: TriageConfig, topic_names: TopicNames
) -> None:
    layout = topic_layout(triage_config, topic_names)
    kinds = {s.kind for s in layout}
    assert kinds == set(TopicKind)
    names = {s.name for s in layout}
    for t in triage_config.tenants:
        assert {topic_names.requests(t.name), topic_names.replies(t.name)} <= names
    for gpu in triage_config.all_gpus():
        assert {topic_names.gpu_work(gpu), topic_names.gpu_control(gpu)} <= names
    assert len(names) == len(layout)


def test_topics_create_cli_reports_existing(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["kafka"] = {"bootstrap_servers": kafka_bootstrap, "topic_prefix": topic_names.prefix}
    cfg_file = tmp_path / "triage.yaml"
    cfg_file.write_text(yaml.safe_dump(data))
    first = runner.invoke(app, ["topics", "create", "--config", str(cfg_file)])
    assert first.exit_code == 0, first.output
    assert f"created {topic_names.requests('rag')}" in _flat(first.stdout)
    second = runner.invoke(app, ["topics", "create", "--config", str(cfg_file)])
    assert second.exit_code == 0, second.output
    assert "0 created" in _flat(second.stdout)
    assert f"exists {topic_names.requests('rag')}" in _flat(second.stdout)
    listed = runner.invoke(app, ["topics", "list", "--config", str(cfg_file)])
    assert listed.exit_code == 0, listed.output
    assert topic_names.gpu_status in listed.stdout


def test_confluent_round_trip_of_an_inference_request(
    kafka_bootstrap: str, topic_names: TopicNames, triage_config: TriageConfig
) -> None:
    create_topics(kafka_bootstrap, topic_names, triage_config)
    topic = topic_names.requests("rag")
    sent = [
        InferenceRequest(
            request_id=f"rt-{i}-{uuid.uuid4().hex[:6]}",
            tenant="rag",
            model="llama-3.1-8b",
            prompt_tokens=100 + i,
            max_tokens=50,
            sla_ms=4000,
            created_at_ms=int(time.time() * 1000),
            prompt="summarise: ünïcödé ✓",
            metadata={"i": str(i)},
        )
        for i in range(5)
    ]
    errors: list[str] = []
    producer = make_producer(kafka_bootstrap)
    for req in sent:
        producer.produce(
            topic,
            key=req.request_id,
            value=req.to_bytes(),
            on_delivery=lambda e, _m: errors.append(str(e)) if e else None,
        )
    assert producer.flush(30) == 0
    assert errors == []

    consumer = make_consumer(kafka_bootstrap, group_id=f"{topic_names.prefix}-rt")
    consumer.subscribe([topic])
    got: list[InferenceRequest] = []
    keys: list[bytes | None] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(InferenceRequest.from_bytes(msg.value() or b""))
            keys.append(msg.key())
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    assert got == sent  # one partition: order kept, every field round-trips
    assert keys == [r.request_id.encode() for r in sent]
    assert committed[0].offset == len(sent)


@pytest.mark.broker
@pytest.mark.timeout(300)
def test_local_broker_lifecycle_is_idempotent(tmp_path: Path) -> None:
    data_dir = tmp_path / "kafka"
    data_dir.mkdir()
    (data_dir / "broker.pid").write_text("999999\n")  # stale: no such broker
    broker = LocalBroker(port=free_run(2), data_dir=data_dir)
    try:
        first = broker.start()
        assert first.started and first.formatted
        assert first.status.reachable and first.status.managed
        assert first.status.version == KAFKA_VERSION
        assert first.ready_s > 0
        assert Path(first.status.log_path).is_file()
        again = broker.start()
        assert not again.started and again.status.pid == first.status.pid
    finally:
        stopped = broker.stop()
    assert stopped is True
    after = broker.status()
    assert not after.reachable and after.pid is None
    assert not (data_dir / "broker.pid").exists()
    assert broker.stop() is False
    try:
        second = broker.start()  # storage is formatted once, the data dir is reused
        assert second.started and not second.formatted and second.status.reachable
    finally:
        broker.stop()
