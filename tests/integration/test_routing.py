"""The routes topic on the real broker: the app's routes as a bare client reads them, and
the partition that client's requests land on (topics/routing.py)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from triage.client import TriageClient
from triage.config.models import TriageConfig
from triage.kafka.clients import make_consumer, make_producer
from triage.topics.admin import create_topics
from triage.topics.messages import InferenceRequest
from triage.topics.names import TopicNames
from triage.topics.routing import publish_routes, read_routes, routes_of

pytestmark = pytest.mark.broker

SHARDS = 2
MODELS = {"m1": "p1", "m2": "p2", "m3": "p2"}


def _config(bootstrap: str, names: TopicNames, models: dict[str, str] = MODELS) -> TriageConfig:
    model = {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bf16",
             "context_tokens": 8192, "prefill_s_per_token": 1e-5, "decode_s_per_token": 0.002}
    pools = sorted(set(MODELS.values()))
    return TriageConfig.model_validate({
        "tenants": [{"name": "a", "rate_tokens_per_s": 1e6, "burst_tokens": 1e6}],
        "models": [{"name": m, "pool": p, **model} for m, p in models.items()],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": p, "gpu_type": "H200", "gpus": [f"g{i}"], "kv_budget_gib": 40.0,
                   "partition": i} for i, p in enumerate(pools)],
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": names.prefix,
                  "request_partitions": SHARDS, "admission_partitions": SHARDS},
    })


def test_the_app_s_routes_are_what_a_bare_client_reads_and_removed_models_are_dropped(
    kafka_bootstrap: str, topic_names: TopicNames
) -> None:
    cfg = _config(kafka_bootstrap, topic_names)
    assert read_routes(kafka_bootstrap, topic_names) == {}  # no topic yet: go by key
    create_topics(kafka_bootstrap, topic_names, cfg)
    assert read_routes(kafka_bootstrap, topic_names) == {}  # nothing written yet
    assert publish_routes(kafka_bootstrap, topic_names, cfg) == 3
    assert read_routes(kafka_bootstrap, topic_names) == {"m1": 0, "m2": 1, "m3": 1}
    assert routes_of(cfg) == {"m1": 0, "m2": 1, "m3": 1}
    # a restart with m3 gone: its route is tombstoned, the others written again
    smaller = _config(kafka_bootstrap, topic_names, {"m1": "p1", "m2": "p2"})
    assert publish_routes(kafka_bootstrap, topic_names, smaller) == 3
    assert read_routes(kafka_bootstrap, topic_names) == {"m1": 0, "m2": 1}
    # a record that is not a route is skipped, not fatal
    p = make_producer(kafka_bootstrap)
    p.produce(topic_names.routes, key=b"bad", value=b'{"model": "bad", "partition": 5, '
              b'"partitions": 2}')
    assert p.flush(10) == 0
    assert read_routes(kafka_bootstrap, topic_names) == {"m1": 0, "m2": 1}


def _partitions_of(bootstrap: str, topic: str, ids: set[str]) -> dict[str, int]:
    c: Any = make_consumer(bootstrap, f"{topic}-probe")
    c.assign([TopicPartition(topic, n, OFFSET_BEGINNING) for n in range(SHARDS)])
    seen: dict[str, int] = {}
    try:
        for _ in range(100):  # bounded: 100 x 0.2 s
            for msg in c.consume(num_messages=100, timeout=0.2):
                if msg.error() is None:
                    seen[InferenceRequest.from_bytes(msg.value()).request_id] = msg.partition()
            if ids <= set(seen):
                break
    finally:
        c.close()
    return seen


def test_a_bare_client_sends_each_request_to_its_model_s_shard(
    kafka_bootstrap: str, topic_names: TopicNames
) -> None:
    cfg = _config(kafka_bootstrap, topic_names)
    create_topics(kafka_bootstrap, topic_names, cfg)
    publish_routes(kafka_bootstrap, topic_names, cfg)
    # no config, no routes given: the client reads them from the topic
    with TriageClient(bootstrap=kafka_bootstrap, tenant="a",
                      topic_prefix=topic_names.prefix) as client:
        ids = set()
        for i in range(12):  # keys hash over both partitions: routes must override them
            model = ("m1", "m2", "m3")[i % 3]
            req = InferenceRequest(request_id=f"r{i}-{model}", tenant="a", model=model,
                                   prompt_tokens=8, max_tokens=8)
            client.send(req)
            ids.add(req.request_id)

    seen = _partitions_of(kafka_bootstrap, topic_names.requests("a"), ids)
    assert set(seen) == ids
    for rid, partition in seen.items():
        assert partition == routes_of(cfg)[rid.split("-")[1]], (rid, partition)
