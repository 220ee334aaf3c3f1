"""The Faust admission app: topics, tables, agents and timers, declared once, top to bottom.

Every handler is a call into AdmissionService; this module only wires Faust to it.

- Tables live on RocksDB (rocksdict) and are recovered from their changelogs. Faust
  lets RocksDB tables be written only inside an event, so the clock ticks through
  Kafka: a timer sends Tick messages to triage.admission and an agent handles them.
  Every input topic of this app has one partition, so each table has one too.
- After recovery, the service rebuilds the core's queue, ledger, buckets and
  predictor from the tables (`on_rebalance_complete`).
- Outputs are staged in batches; a batch commits in one Kafka transaction after the
  changelog writes behind it are flushed, and input offsets commit only after every batch
  made from them (outbox.py, docs/reliability.md "Crash safety"). Recovery re-sends
  the outputs of batches that never committed, from the table records that carry them.
- Every Kafka call in timers retries with backoff; /ready and /live report whether the
  app is deciding (health.py).
- New tenants' request topics are found by a discovery timer and added to the
  subscription without a restart; tenants added to or removed from the config file are
  picked up too (docs/reliability.md, "Config changes").
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.types import TP

from triage.config.checks import runnable_problem
from triage.config.models import TriageConfig
from triage.kafka.security import use_kafka_security
from triage.streams import faust_fixes
from triage.streams.changelog import ChangelogProducer
from triage.streams.committer import Committer, commit_continuously, exit_as_zombie
from triage.streams.discovery import (
    new_request_topics,
    reload_config,
    request_topics_on_broker,
    subscribe,
)
from triage.streams.engine import (
    RAW_TOPIC,
    faust_app,
    freeze_heap,
    install_patches,
    raw_table,
    reply_lane,
    start_outbox,
)
from triage.streams.gaps import GapGuard, Record, committed_offsets, read_again
from triage.streams.health import Health
from triage.streams.lapse import (
    LapseGuard,
    SendCheck,
    coordinator_member_id,
    member_of_group,
    missed_a_rebalance,
)
from triage.streams.liveness import HeartbeatGuard
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import KafkaOutbox, reply_marks_topic
from triage.streams.priority import serve_control_partitions_first
from triage.streams.service import AdmissionService
from triage.streams.sharding import ShardedServices
from triage.streams.store import BUCKETS, LEARNED, REQUESTS, StrKeys
from triage.topics.admin import (
    SHARDED_KINDS,
    create_topics,
    shard_layout_problem,
    topic_layout,
)
from triage.topics.errors import ShardLayoutError
from triage.topics.messages import Tick
from triage.topics.names import TopicNames
from triage.topics.routing import publish_routes

log = logging.getLogger(__name__)

DISCOVERY_S = 3.0
# how long a lapsed process waits for an outbox transaction to end before it exits
# (KafkaOutbox.quiesce): its send check's membership question and abort, with room
LAPSE_QUIESCE_S = 10.0
# Heartbeats and completions must not wait behind a request flood (docs/architecture.md,
# "Priority under a request flood"): each fetch hands over at most this many records
# (control partitions first, priority.py), so the conductor never has thousands of
# requests to push through before it reaches a heartbeat. A request queue of 64 as well
# measured p50 117 ms at 150 requests/s (5 ms without): Faust's queue pressure then
# pauses the request partitions until a fetch times out.
MAX_POLL_RECORDS = 200


@dataclass
class AdmissionApp:
    """The Faust app and what it drives."""

    app: faust.App
    shards: ShardedServices
    outbox: KafkaOutbox
    names: TopicNames
    request_topic: Any
    config_path: Path | None = None
    config_mtime: float | None = None
    restored: bool = False
    subscribed: set[str] = field(default_factory=set)
    unassigned_since: dict[str, float] = field(default_factory=dict)  # subscribed, not read yet
    health: Health = field(default_factory=Health)
    committer: Committer | None = None
    http_port: int = 0
    discovery_failures: int = 0


def build_app(
    config: TriageConfig, *, config_path: Path | None = None, datadir: str | None = None,
    metrics_port: int | None = None,
) -> AdmissionApp:
    k = config.kafka
    problem = runnable_problem(config)
    if problem is not None:
        raise ValueError(problem)
    names = TopicNames.of(k.topic_prefix, k.tenant_topics)
    use_kafka_security(k)  # every client this process builds speaks as kafka.security says
    create_topics(k.bootstrap_servers, names, config)
    app_id = f"{names.prefix}.app.{config.admission.app_id}"
    # bare clients route by them (the reader's group id under the app's ACL prefix)
    publish_routes(k.bootstrap_servers, names, config, group_id=f"{app_id}.routes")
    layout_problem = shard_layout_problem(k.bootstrap_servers, [
        *(s.name for s in topic_layout(config, names) if s.kind in SHARDED_KINDS),
        *request_topics_on_broker(config, names),
        f"{app_id}.outbox",  # the marks topics (engine.start_outbox)
        reply_marks_topic(f"{app_id}.outbox"),
        # Faust names a table's changelog so (Collection._changelog_topic_name)
        *(f"{app_id}-{table}-changelog" for table in (REQUESTS, BUCKETS, LEARNED)),
    ], k.admission_partitions)
    if layout_problem is not None:
        raise ShardLayoutError(layout_problem)
    outbox = start_outbox(config, app_id, reply_lane(names))
    install_patches(names.requests_pattern)
    serve_control_partitions_first(names.requests_pattern)
    app = faust_app(config, app_id, datadir=datadir or config.admission.datadir,
                    max_poll_records=MAX_POLL_RECORDS)

    # --- topics --------------------------------------------------------------------
    # every tenant's topic on the broker, configured or not: a removed tenant's requests
    # are answered `invalid` (unknown_tenant), not left unread
    initial = sorted({names.requests(t.name) for t in config.tenants}
                     | set(request_topics_on_broker(config, names)))
    raw = RAW_TOPIC
    request_topic = app.topic(*initial, **raw)
    completions_topic = app.topic(names.completions, **raw)
    status_topic = app.topic(names.gpu_status, **raw)
    ticks_topic = app.topic(names.admission, **raw)

    # --- tables (one changelog partition per shard; see raw_table) -------------------
    parts = k.admission_partitions
    changelog = ChangelogProducer(k.bootstrap_servers)

    def table(name: str) -> Any:
        return StrKeys(raw_table(app, name, changelog, parts))

    metrics = AdmissionMetrics()
    shards = ShardedServices(config, names=names, outbox=outbox, metrics=metrics,
                             tables=(table(REQUESTS), table(BUCKETS), table(LEARNED)))
    health = Health()
    committer = Committer(app, outbox, health, changelog, k.request_partitions)
    gaps = GapGuard()

    def is_member(member_id: str | None) -> bool:
        return member_of_group(k.bootstrap_servers, app_id, member_id)

    async def still_member() -> bool:
        return await asyncio.to_thread(is_member, coordinator_member_id(app))

    def on_lapse() -> None:
        if not outbox.quiesce(LAPSE_QUIESCE_S):
            log.warning("an outbox transaction did not end within %.0f s; exiting anyway",
                        LAPSE_QUIESCE_S)
        exit_as_zombie("no longer a member of its group: frozen past its session timeout")

    lapse = LapseGuard(config.admission.session_timeout_s, still_member, on_lapse)
    committer.deciding = lapse.deciding

    def send_check() -> SendCheck:
        return SendCheck(coordinator_member_id(app), time.monotonic(), lapse.gap_s, is_member)

    committer.send_check = send_check
    adopting = asyncio.Lock()
    admission = AdmissionApp(app=app, shards=shards, outbox=outbox, names=names,
                             request_topic=request_topic, config_path=config_path,
                             subscribed=set(initial), health=health, committer=committer)
    port = config.metrics.admission_port if metrics_port is None else metrics_port
    admission.http_port = metrics.serve(config.metrics.host, port, ready=health.check,
                                        live=health.live)

    # --- recovery: rebuild each owned shard once its tables are back --------------------
    def owned() -> set[int]:
        """Shards held: a shard is where its clock-tick partition is (every input is
        co-partitioned); standby copies of changelogs the group may hand an extra
        instance are not a shard."""
        return {tp.partition for tp in app.consumer.assignment() if tp.topic == names.admission}

    async def adopt(partition: int, lapsed: bool = False) -> AdmissionService:
        """The service of `partition`, rebuilt from the tables if this process has none
        (assigned by the group now, or an event of it came first). `lapsed`: this process
        held it before it missed a rebalance (below), so another may have committed
        batches for it since: read where they stand, as a takeover does."""
        async with adopting:
            svc = shards.get(partition)
            if svc is not None:
                return svc
            committer.install()  # (idempotent) offsets never pass outputs not committed
            if parts == 1:
                gaps.start_at(await asyncio.to_thread(
                    committed_offsets, k.bootstrap_servers, app_id, sorted(admission.subscribed)))
                shards.adopt(0, time.time(), await asyncio.to_thread(outbox.take_over, 0)
                             if lapsed else None)
            else:
                committed = await asyncio.to_thread(outbox.take_over, partition)
                gaps.forget(partition)
                gaps.start_at(await asyncio.to_thread(
                    committed_offsets, k.bootstrap_servers, app_id, sorted(admission.subscribed),
                    [partition]))
                shards.adopt(partition, time.time(), committed)
            outbox.mark_partitions.add(0 if parts == 1 else partition)
            adopted = shards.get(partition)
            assert adopted is not None
            return adopted

    async def owner(partition: int) -> AdmissionService | None:
        """The service deciding for `partition`; None while this process may not decide
        (lapse.py): the event is skipped, and its offset, not committable by a lapsed
        member, is read again by the owner."""
        if not await lapse.deciding():
            return None
        svc = shards.get(partition)
        return svc if svc is not None else await adopt(partition)

    generations: list[int] = []  # the consumer generation of each completed rebalance

    @app.on_rebalance_complete.connect
    async def _rebuilt(sender: Any, /, *_args: Any, signal: Any, **_kw: Any) -> None:
        gaps.watch(time.monotonic())
        first = not admission.restored
        if first:
            committer.install()
        mine = owned()
        health.held = len(mine)
        lapsed = missed_a_rebalance(generations, app.consumer_generation_id) or lapse.lapsed
        lapse.rebalanced()
        for n in [n for n in shards.services if n not in mine or lapsed]:
            shards.drop(n)
            if parts > 1:
                gaps.forget(n)
        if lapsed and mine:
            log.warning("this instance missed a rebalance (generation %d -> %d: frozen or "
                        "cut off past its session timeout); another may have decided for "
                        "its shards meanwhile: rebuilding shards %s from the tables",
                        generations[-2], generations[-1], sorted(mine))
        for n in sorted(mine):
            if shards.get(n) is None:
                await adopt(n, lapsed)
            else:  # kept across the rebalance: its batches are marked again, and Faust
                # may jump past what it handed out before the rebalance (gaps.py; no
                # broker call here: a slow rebalance callback races Faust's fetcher)
                outbox.mark_partitions.add(n)
                gaps.resume(n)
        if first:
            freeze_heap()
            admission.restored = health.restored = True
            health.ticked()

    @app.on_partitions_revoked.connect
    async def _revoked(sender: Any, /, *args: Any, signal: Any, **_kw: Any) -> None:
        # Faust has flushed (so the outbox committed) what the revoked shards staged; from
        # here until they are assigned again no batch of ours speaks for them. Records
        # handed out around the rebalance may be dropped: watch for jumps (gaps.py)
        gaps.watch(time.monotonic())
        for tp in args[0] if args else ():
            if tp.topic == names.admission:
                outbox.mark_partitions.discard(tp.partition)

    @app.on_before_shutdown.connect
    async def _stopping(sender: Any, /, *_args: Any, **_kw: Any) -> None:
        outbox.stop()  # no more waiting on the broker: uncommitted outputs replay on restart

    # --- agents ----------------------------------------------------------------------
    async def skipped_before(msg: Any) -> list[Record]:
        """The records of `msg`'s partition that Faust jumped over before handing out
        `msg`, read again (gaps.py); usually none."""
        skipped = gaps.check(msg.topic, msg.partition, msg.offset, time.monotonic())
        if skipped is None:
            return []
        return await read_again(gaps, k.bootstrap_servers, f"{app_id}.gap-reader",
                                msg.topic, msg.partition, *skipped)

    @app.agent(request_topic, concurrency=1)
    async def requests(stream: Any) -> None:
        ebb = app.producer.buffer.wait_until_ebb
        async for event in stream.events():
            await ebb()  # see "Priority under a request flood" in docs/architecture.md
            msg = event.message
            service = await owner(msg.partition)
            if service is None:
                continue
            for off, key, value, headers in await skipped_before(msg):
                service.on_request(topic=msg.topic, key=key, value=value,
                                   partition=msg.partition, offset=off, now=time.time(),
                                   headers=headers)
            service.on_request(topic=msg.topic, key=event.key, value=event.value,
                               partition=msg.partition, offset=msg.offset, now=time.time(),
                               headers=event.headers)

    @app.agent(completions_topic, concurrency=1)
    async def completions(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            service = await owner(msg.partition)
            if service is None:
                continue
            # a completion Faust drops would leave its request running for ever
            for off, key, value, _headers in await skipped_before(msg):
                service.on_completion(value, key=key, partition=msg.partition,
                                      offset=off, now=time.time())
            service.on_completion(event.value, key=event.key, partition=msg.partition,
                                  offset=msg.offset, now=time.time())

    guards: dict[int, HeartbeatGuard] = {}  # per status partition (shard)

    def guard_of(partition: int) -> HeartbeatGuard:
        g = guards.get(partition)
        if g is None:
            g = guards[partition] = HeartbeatGuard(time.monotonic)
        return g

    @app.agent(status_topic, concurrency=1)
    async def heartbeats(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            service = await owner(msg.partition)
            if service is None:
                continue
            guard_of(msg.partition).seen(event.key, event.value, msg.offset)
            service.on_status(event.value, key=event.key, partition=msg.partition,
                              offset=msg.offset, now=time.time())

    def status_highwater(partition: int) -> int | None:
        try:
            hw = app.consumer.highwater(TP(names.gpu_status, partition))
        except Exception:  # not assigned yet, or mid-rebalance
            return None
        return hw if isinstance(hw, int) else None

    @app.agent(ticks_topic, concurrency=1)
    async def ticks(stream: Any) -> None:
        async for event in stream.events():
            n = event.message.partition
            service = shards.get(n) if await lapse.deciding() else None
            if admission.restored and service is not None:
                now = time.time()
                guard = guard_of(n)
                if guard.should_refresh(status_highwater(n)):
                    for value in list(guard.last.values()):  # see liveness.py
                        service.on_status(value, now=now)
                service.on_tick(now)
                health.ticked()

    # --- timers ----------------------------------------------------------------------
    @app.timer(interval=config.policy.tick_ms / 1000.0)
    async def tick() -> None:
        health.beat()
        if admission.restored and await lapse.deciding():
            tick = Tick(at_ms=int(time.time() * 1000)).to_bytes()
            for n in sorted(shards.services):  # every shard held ticks on its own partition
                outbox.send_internal(names.admission, b"tick", tick, n if parts > 1 else -1)

    @app.task
    async def commit_outputs() -> None:
        await commit_continuously(committer, outbox, lambda: admission.restored)

    @app.timer(interval=DISCOVERY_S)
    async def discover() -> None:
        if not admission.restored:
            return
        # a failing broker call must never stop the app: skip this round, back off
        skip = min(2 ** admission.discovery_failures, 20)
        if admission.discovery_failures and int(time.monotonic() / DISCOVERY_S) % skip:
            return
        try:
            changed = await asyncio.to_thread(reload_config, admission)
            if changed is not None:  # applied by the next tick, inside an event
                shards.reconfigure(changed)
            new = await asyncio.to_thread(new_request_topics, admission)
            if new:
                subscribe(admission, new)
                # a new tenant's partitions are read from their beginning: the guard
                # expects their first offset there (gaps.py)
                gaps.start_at(await asyncio.to_thread(
                    committed_offsets, k.bootstrap_servers, app_id, new, sorted(shards.services)))
            faust_fixes.flag_again_if_unassigned(app, admission.unassigned_since)
        except Exception as exc:
            admission.discovery_failures += 1
            log.warning("topic discovery failed (%s); retrying with backoff", exc)
        else:
            admission.discovery_failures = 0

    return admission
