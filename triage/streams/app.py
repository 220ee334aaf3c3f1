"""The Faust admission app: topics, tables, agents and timers, declared once, top to bottom.

Every handler is a call into AdmissionService; this module only wires Faust to it.

- Tables live on RocksDB (rocksdict) and are recovered from their changelogs. Faust
  lets RocksDB tables be written only inside an event, so the clock ticks through
  Kafka: a timer sends Tick messages to triage.admission and an agent handles them.
  Every input topic of this app has one partition, so each table has one too.
- After recovery, the service rebuilds the core's queue, ledger, buckets and
  predictor from the tables (`on_rebalance_complete`).
- Outputs go through a confluent-kafka producer that is flushed before Faust commits
  input offsets, so a crash never commits a request whose answers were not sent.
- New tenants' request topics are found by a discovery timer and added to the
  subscription without a restart; tenants added to or removed from the config file are
  picked up too (docs/reliability.md, "Config changes").
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from triage.config.checks import runnable_problem
from triage.config.load import load_config, tenant_change
from triage.config.models import TriageConfig
from triage.kafka.clients import make_admin
from triage.kafka.security import faust_credentials, use_kafka_security
from triage.streams import faust_fixes
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import KafkaOutbox
from triage.streams.service import AdmissionService
from triage.streams.store import BUCKETS, LEARNED, REQUESTS, MappingStore
from triage.topics.admin import TopicSpec, create_topics, ensure_topics, topic_layout
from triage.topics.messages import Tick
from triage.topics.names import TopicKind, TopicNames

log = logging.getLogger(__name__)

DISCOVERY_S = 3.0


@dataclass
class AdmissionApp:
    """The Faust app and what it drives."""

    app: faust.App
    service: AdmissionService
    outbox: KafkaOutbox
    names: TopicNames
    request_topic: Any
    config_path: Path | None = None
    config_mtime: float | None = None
    restored: bool = False
    subscribed: set[str] = field(default_factory=set)
    unassigned_since: dict[str, float] = field(default_factory=dict)  # subscribed, not read yet


FETCH_MAX_WAIT_MS = 20


def _short_fetch_wait() -> None:
    """faust-streaming hard-codes fetch_max_wait_ms=1500 on its consumer. aiokafka leaves
    a partition that still has buffered records out of the next fetch, and that fetch then
    waits up to the full 1.5 s for the *other* partitions: a request waited ~1 s for its
    decision at 150 requests/s. A short wait costs a few more fetch requests when idle."""
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_triage_short_fetch", False):
        return
    create = cls._create_worker_consumer

    def _create(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read by its Fetcher at start()
        return consumer

    cls._create_worker_consumer = _create
    cls._triage_short_fetch = True


def build_app(
    config: TriageConfig, *, config_path: Path | None = None, datadir: str | None = None,
    metrics_port: int | None = None,
) -> AdmissionApp:
    k = config.kafka
    problem = runnable_problem(config)
    if problem is not None:
        raise ValueError(problem)
    names = TopicNames(k.topic_prefix)
    use_kafka_security(k)  # every client this process builds speaks as kafka.security says
    create_topics(k.bootstrap_servers, names, config)
    outbox = KafkaOutbox(k.bootstrap_servers)
    _short_fetch_wait()
    faust_fixes.skip_commits_while_resubscribing()
    faust_fixes.read_fresh_partitions_from_the_start(names.requests_pattern)

    app = faust.App(
        f"{names.prefix}.app.{config.admission.app_id}",
        broker=f"kafka://{k.bootstrap_servers}",
        broker_credentials=faust_credentials(k.security),
        store="rocksdb://",
        datadir=datadir or config.admission.datadir,
        topic_partitions=1,
        topic_replication_factor=k.replication_factor,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        producer_linger_ms=5,
        web_enabled=False,
        table_cleanup_interval=3600.0,
    )

    # --- topics --------------------------------------------------------------------
    # every tenant's topic on the broker, configured or not: a removed tenant's requests
    # are answered `invalid` (unknown_tenant), not left unread
    initial = sorted({names.requests(t.name) for t in config.tenants}
                     | set(_request_topics_on_broker(config, names)))
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                           "value_serializer": "raw"}
    request_topic = app.topic(*initial, **raw)
    completions_topic = app.topic(names.completions, **raw)
    status_topic = app.topic(names.gpu_status, **raw)
    ticks_topic = app.topic(names.admission, **raw)

    # --- tables (key partitioner: writable from timers; one changelog partition) ----
    def table(name: str) -> Any:
        t: Any = app.Table(name, default=None, partitions=1, use_partitioner=True,
                           key_type=bytes, value_type=bytes)
        # Faust derives serializers from the types ("json" for bytes); ours are raw bytes.
        t.key_serializer = "raw"
        t.value_serializer = "raw"
        return t

    store = MappingStore(_StrKeys(table(REQUESTS)), _StrKeys(table(BUCKETS)),
                         _StrKeys(table(LEARNED)))
    metrics = AdmissionMetrics()
    service = AdmissionService(config, names=names, outbox=outbox, store=store,
                               metrics=metrics)
    admission = AdmissionApp(app=app, service=service, outbox=outbox, names=names,
                             request_topic=request_topic, config_path=config_path,
                             subscribed=set(initial))
    port = config.metrics.admission_port if metrics_port is None else metrics_port
    metrics.serve(config.metrics.host, port)

    # --- recovery: rebuild the core once the tables are back ----------------------------
    @app.on_rebalance_complete.connect
    async def _rebuilt(sender: Any, /, *_args: Any, signal: Any, **_kw: Any) -> None:
        if not admission.restored:
            service.restore(time.time())
            admission.restored = True
            _flush_outbox_before_commits(app, outbox)

    # --- agents ----------------------------------------------------------------------
    @app.agent(request_topic, concurrency=1)
    async def requests(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            service.on_request(topic=msg.topic, key=event.key, value=event.value,
                               partition=msg.partition, offset=msg.offset, now=time.time())

    @app.agent(completions_topic, concurrency=1)
    async def completions(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            service.on_completion(event.value, key=event.key, partition=msg.partition,
                                  offset=msg.offset, now=time.time())

    @app.agent(status_topic, concurrency=1)
    async def heartbeats(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            service.on_status(event.value, key=event.key, partition=msg.partition,
                              offset=msg.offset, now=time.time())

    @app.agent(ticks_topic, concurrency=1)
    async def ticks(stream: Any) -> None:
        async for _event in stream.events():
            if admission.restored:
                service.on_tick(time.time())

    # --- timers ----------------------------------------------------------------------
    @app.timer(interval=config.policy.tick_ms / 1000.0)
    async def tick() -> None:
        if admission.restored:
            outbox.send(names.admission, "tick", Tick(at_ms=int(time.time() * 1000)))
            outbox.poll()

    @app.timer(interval=DISCOVERY_S)
    async def discover() -> None:
        if admission.restored:
            changed = await asyncio.to_thread(_reload_config, admission)
            if changed is not None:  # applied by the next tick, inside an event
                service.reconfigure(changed)
            new = await asyncio.to_thread(_new_request_topics, admission)
            if new:
                _subscribe(admission, new)
            faust_fixes.flag_again_if_unassigned(app, admission.unassigned_since)

    return admission


def _flush_outbox_before_commits(app: faust.App, outbox: KafkaOutbox) -> None:
    """Faust flushes its producer before it commits offsets; flush ours there too."""
    producer = app.producer
    original: Callable[[], Awaitable[None]] = producer.flush

    async def flush() -> None:
        await original()
        left = await asyncio.to_thread(outbox.flush, 30.0)
        if left:
            log.error("%d output messages still unacknowledged at commit", left)

    producer.flush = flush  # type: ignore[method-assign]  # wrap, keep Faust's own flush


def _request_topics_on_broker(config: TriageConfig, names: TopicNames) -> list[str]:
    pattern = re.compile(names.requests_pattern)
    md = make_admin(config.kafka.bootstrap_servers).list_topics(timeout=5.0)
    return [t for t in md.topics if pattern.match(t)]


def _new_request_topics(admission: AdmissionApp) -> list[str]:
    """Request topics on the broker that the app does not read yet (new tenants)."""
    found = _request_topics_on_broker(admission.service.config, admission.names)
    return sorted(t for t in found if t not in admission.subscribed)


def _subscribe(admission: AdmissionApp, topics: list[str]) -> None:
    """Add topics to the request agent's subscription (Faust resubscribes and rebalances),
    making sure each new tenant can be answered (its reply topic exists)."""
    names = admission.names
    config = admission.service.config
    template = next(s for s in topic_layout(config, names) if s.kind is TopicKind.REPLIES)
    replies = [
        TopicSpec(names.replies(tenant), TopicKind.REPLIES, template.partitions,
                  template.replication_factor, template.config)
        for tenant in map(names.tenant_of_request_topic, topics) if tenant is not None
    ]
    if replies:
        ensure_topics(config.kafka.bootstrap_servers, replies)
    faust_fixes.extend_subscription(admission.app, admission.request_topic,
                                    admission.subscribed, topics)
    admission.subscribed.update(topics)
    admission.unassigned_since.update((t, time.monotonic()) for t in topics)
    log.info("subscribed to new request topics: %s", ", ".join(topics))


def _reload_config(admission: AdmissionApp) -> TriageConfig | None:
    """The config to adopt when tenants were added to or removed from the config file
    (other changes need a restart); creates the added tenants' topics. Runs in a thread:
    it reads the service's config but leaves applying the change to the event loop."""
    path = admission.config_path
    if path is None:
        return None
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    last, admission.config_mtime = admission.config_mtime, mtime
    if last is None or mtime == last:
        return None
    try:
        changed = tenant_change(admission.service.config, load_config(path))
    except Exception as exc:  # a bad edit must not stop admission
        log.error("config reload failed, keeping the running config: %s", exc)
        return None
    if changed is not None:
        create_topics(changed.kafka.bootstrap_servers, admission.names, changed)
    return changed


class _StrKeys(MutableMapping[str, Any]):
    """A Faust table seen through str keys (the raw key serializer hands back bytes)."""

    def __init__(self, table: Any) -> None:
        self._t = table

    def get(self, key: str, default: Any = None) -> Any:
        return self._t.get(key.encode(), default)

    def __getitem__(self, key: str) -> Any:
        return self._t[key.encode()]

    def __setitem__(self, key: str, value: Any) -> None:
        self._t[key.encode()] = value

    def __delitem__(self, key: str) -> None:
        del self._t[key.encode()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.encode() in self._t

    def __iter__(self) -> Iterator[str]:
        return (k.decode() if isinstance(k, bytes) else str(k) for k in self._t)

    def __len__(self) -> int:
        return len(self._t)
