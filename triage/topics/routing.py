"""The routes topic: which request-topic partition serves which model.

A sharded admission app owns each pool on one partition (topics/shards.py). A producer
that knows the config sends each request to its model's partition; one that does not
(a bare `TriageClient(bootstrap=..., tenant=...)`) would send by key, and the shard that
reads it forwards it to its owner: one more trip through Kafka per request. So the app
writes `model -> partition` on a compacted topic at every start (what the config says
now; models it no longer serves get a tombstone), and bare clients read it once, and
again when they meet a model it does not name (docs/architecture.md, "Routing").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from pydantic import ValidationError

from triage.config.models import TriageConfig
from triage.kafka.clients import make_consumer, make_producer
from triage.kafka.scan import ReadTimeoutError, read_to_end
from triage.topics.messages import Route
from triage.topics.names import TopicNames
from triage.topics.shards import shard_of_model

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 5.0


def routes_of(config: TriageConfig) -> dict[str, int]:
    """model -> partition as the config says (every model; partition 0 unsharded)."""
    return {m.name: shard_of_model(config, m.name) for m in config.models}


def publish_routes(bootstrap: str, names: TopicNames, config: TriageConfig,
                   settings: Mapping[str, Any] | None = None,
                   group_id: str | None = None) -> int:
    """Write the config's routes, and a tombstone for each model the topic names that the
    config does not (its requests then go by key and are answered where they land).
    Every instance of the app writes the same records: compaction keeps one per model.
    Returns how many records were written."""
    current = read_routes(bootstrap, names, settings=settings, group_id=group_id)
    wanted = routes_of(config)
    parts = config.kafka.admission_partitions
    p = make_producer(bootstrap, **dict(settings or {}))
    n = 0
    for model, partition in sorted(wanted.items()):
        route = Route(model=model, partition=partition, partitions=parts)
        p.produce(names.routes, key=model.encode(), value=route.to_bytes())
        n += 1
    for model in sorted(set(current) - set(wanted)):
        p.produce(names.routes, key=model.encode(), value=None)
        n += 1
    left = p.flush(30.0)
    if left:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                        f"{left} route records not delivered"))
    return n


def read_routes(bootstrap: str, names: TopicNames, *, timeout_s: float = READ_TIMEOUT_S,
                settings: Mapping[str, Any] | None = None,
                group_id: str | None = None) -> dict[str, int]:
    """The routes on the topic now (the last record per model; a tombstone removes it).
    Empty when the topic does not exist or holds nothing: requests then go by key. A
    record that does not read as a Route is skipped with a warning. The reader is
    assigned, never joins or commits; `group_id` only names it (a tenant's own prefix
    under ACLs)."""
    c = make_consumer(bootstrap, group_id or f"{names.prefix}.routes-reader",
                      **{**dict(settings or {}), "enable.partition.eof": True})
    try:
        tp = TopicPartition(names.routes, 0)
        try:
            low, high = c.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
        except KafkaException as exc:
            log.info("no routes topic %s (%s): requests go by key", names.routes, exc)
            return {}
        if high <= low:
            return {}
        c.assign([TopicPartition(names.routes, 0, OFFSET_BEGINNING)])
        routes: dict[str, int] = {}
        try:
            for msg in read_to_end(c, "the routes", timeout_s=timeout_s, poll_s=0.2, end=high):
                key = (msg.key() or b"").decode("utf-8", "replace")
                value = msg.value()
                if value is None:
                    routes.pop(key, None)
                    continue
                try:
                    route = Route.from_bytes(value)
                except ValidationError as exc:
                    log.warning("routes: record at offset %d skipped: %s", msg.offset(),
                                exc.errors()[0]["msg"] if exc.errors() else exc)
                    continue
                routes[route.model] = route.partition
        except ReadTimeoutError:
            log.warning("routes: read %d of them before the %.0f s timeout; the rest go by "
                        "key", len(routes), timeout_s)
        return routes
    finally:
        c.close()
