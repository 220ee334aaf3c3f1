"""The Faust engine as the admission app runs it: the app's settings, the process-wide
fixes, and the transactional outbox. Factored out of app.py so that `triage bench
pipeline`'s ceiling apps (triage/bench/ceiling_app.py) run on exactly the same engine
as the admission app, and measure what it can do."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from triage.config.models import TriageConfig
from triage.kafka.security import faust_credentials
from triage.streams import eager, faust_fixes, fetch_scan, fetch_sessions, per_partition
from triage.streams.changelog import ChangelogProducer
from triage.streams.outbox import KafkaOutbox, reply_marks_topic
from triage.topics.admin import TopicSpec, ensure_topics
from triage.topics.names import TopicKind, TopicNames

# A fetch returns once it holds FETCH_MIN_BYTES or after FETCH_MAX_WAIT_MS. With
# aiokafka's 1 byte, a steady trickle (a few hundred requests/s) made a fetch per record
# or two, and fetching was the consumer thread's whole cost: at 500/s the app spent ~30%
# more CPU per request than with fetches held 5 ms (docs/architecture.md, "Fetches held
# a few milliseconds"). Under a flood 16 KB is there at once. After an empty fetch the
# next one waits for the first byte instead (fetch_sessions.IDLE_WAIT_MS), so an idle
# consumer does not poll every 5 ms.
FETCH_MAX_WAIT_MS = 5
FETCH_MIN_BYTES = 16384
# aiokafka sends no fetch at all to a broker while a partition it leads still holds
# buffered records younger than this (its default is 100 ms): during a request flood a
# completion or heartbeat produced meanwhile waited that long before it was even fetched.
PREFETCH_BACKOFF_S = 0.01


def _short_fetch_waits() -> None:
    """faust-streaming hard-codes fetch_max_wait_ms=1500 on its consumer. aiokafka leaves
    a partition that still has buffered records out of the next fetch, and that fetch then
    waits up to the full 1.5 s for the *other* partitions: a request waited ~1 s for its
    decision at 150 requests/s. And it holds back that next fetch for PREFETCH_BACKOFF_S.
    Short waits cost a few more fetch requests when idle or flooded. Once started, the
    consumer fetches in incremental sessions (fetch_sessions.py) and walks its
    assignment the faster way (fetch_scan.py): both O(partitions) costs per fetch that
    grew with the number of tenants."""
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_triage_short_fetch", False):
        return
    create = cls._create_worker_consumer

    def _create(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read by its Fetcher at start()
        consumer._fetch_min_bytes = FETCH_MIN_BYTES
        start = consumer.start

        async def start_with_short_backoff() -> None:
            await start()
            consumer._fetcher._prefetch_backoff = PREFETCH_BACKOFF_S  # built by start()
            fetch_sessions.install(consumer)
            fetch_scan.install(consumer._fetcher)

        consumer.start = start_with_short_backoff
        return consumer

    cls._create_worker_consumer = _create
    cls._triage_short_fetch = True


def freeze_heap() -> None:
    """Move every object alive now (modules, classes, the app, the restored state) into
    the collector's permanent generation, once the app has started. A full collection
    walks every tracked object: with Faust, aiokafka and pydantic loaded that took
    80-110 ms, mid-stream, and every request in flight waited it out (the bench's p99).
    Frozen objects are never walked again; only what was allocated since is."""
    gc.collect()
    gc.freeze()


# How long the thread holding the GIL keeps it while another waits (CPython: 5 ms).
GIL_SWITCH_S = 0.0005


def _short_gil_slices() -> None:
    """Let the app's helper threads (the outbox's transactions, Faust's consumer thread)
    have the GIL within half a millisecond of asking. They hold it for short bursts
    between waits on the broker, and at CPython's 5 ms each burst could wait that long
    behind the event loop while it decided: in a request flood a batch's commit took
    0.1-0.4 s, and completions came back at half the rate (docs/architecture.md, "A
    flush bounded to its batch")."""
    sys.setswitchinterval(GIL_SWITCH_S)


def install_patches(fresh_pattern: str) -> None:
    """The process-wide Faust fixes every app of ours runs with (idempotent)."""
    _short_gil_slices()
    _short_fetch_waits()
    per_partition.install()
    eager.install()
    faust_fixes.commit_against_one_assignment()  # before the wrapper below, which calls it
    faust_fixes.skip_commits_while_resubscribing()
    faust_fixes.highwater_while_resubscribing()
    faust_fixes.read_fresh_partitions_from_the_start(fresh_pattern)


def reply_lane(names: TopicNames) -> Callable[[str], bool]:
    """The outputs the outbox's reply lane carries (lanes.py): the tenants' reply topics,
    which one batch touches hundreds of at 1,000 tenants, and the decision records."""
    replies, decisions = f"{names.prefix}.replies.", names.decisions
    return lambda topic: topic == decisions or topic.startswith(replies)


def start_outbox(config: TriageConfig, app_id: str,
                 is_reply: Callable[[str], bool]) -> KafkaOutbox:
    """The app's transactional outbox (and its lanes' marks topics), started."""
    k = config.kafka
    marks = f"{app_id}.outbox"
    shards = k.admission_partitions
    ensure_topics(k.bootstrap_servers, [TopicSpec(topic, TopicKind.ADMISSION, shards,
                                                  k.replication_factor)
                                        for topic in (marks, reply_marks_topic(marks))])
    outbox = KafkaOutbox(k.bootstrap_servers,
                         transactional_id=f"{app_id}.outbox{instance_suffix(config)}",
                         marks_topic=marks, shards=shards, is_reply=is_reply)
    outbox.start()
    return outbox


def faust_app(
    config: TriageConfig, app_id: str, *, datadir: str, max_poll_records: int | None = None
) -> faust.App:
    """A Faust app with the admission app's settings (`max_poll_records`: records one
    fetch hands over; None: Faust's default)."""
    k = config.kafka
    return faust.App(
        app_id,
        broker=f"kafka://{k.bootstrap_servers}",
        broker_credentials=faust_credentials(k.security),
        # Static membership: a restarted app (same instance id) gets its partitions back
        # at once instead of waiting out the dead member's session (docs/reliability.md).
        consumer_group_instance_id=(f"{app_id}.instance{instance_suffix(config)}"
                                    if config.admission.static_membership else None),
        broker_session_timeout=config.admission.session_timeout_s,
        broker_heartbeat_interval=min(3.0, config.admission.session_timeout_s / 5),
        store="rocksdb://",
        datadir=datadir,
        topic_partitions=k.admission_partitions,
        # a warm copy of every changelog partition on another instance: a failover
        # replays the tail of a changelog, not all of it
        table_standby_replicas=1,
        topic_replication_factor=k.replication_factor,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        broker_max_poll_records=max_poll_records,
        producer_linger_ms=5,
        web_enabled=False,
        table_cleanup_interval=3600.0,
    )




# Topics and tables carry raw bytes: our codecs (topics/messages.py) do the encoding.
RAW_TOPIC: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                             "value_serializer": "raw"}


def instance_suffix(config: TriageConfig) -> str:
    """What tells this instance's group and transactional ids from its siblings' (none for
    instance "0", so an unsharded app keeps the ids it always had)."""
    name = config.admission.instance
    return "" if name == "0" else f"-{name}"


def raw_table(app: faust.App, name: str, changelog: ChangelogProducer, partitions: int = 1,
              ) -> Any:
    """A table of raw bytes whose changelog `changelog` writes. One partition: keyed by
    its own partitioner (every write lands on partition 0). Sharded: each write goes to
    the partition of the event being handled, so a shard's state lives on its own
    partition (writes happen in events only: the clock ticks through Kafka)."""
    t: Any = app.Table(name, default=None, partitions=partitions,
                       use_partitioner=partitions == 1, key_type=bytes, value_type=bytes)
    # Faust derives serializers from the types ("json" for bytes); ours are raw bytes.
    t.key_serializer = "raw"
    t.value_serializer = "raw"
    changelog.attach(t)
    return t
