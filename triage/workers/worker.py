"""One GPU's worker: consume its work and control topics, run attempts through a backend,
publish completions (and optionally replies) and heartbeats.

Delivery is at-least-once: an input offset is committed only after what it produced
is acknowledged by the broker, and a redelivered WorkItem whose work id (request#attempt)
already ran, or is running, is skipped. Attempts run concurrently (the engine batches
them); control messages abort an attempt, which then reports ``preempted`` or
``cancelled`` with the tokens it generated. The dispatcher requeues a preempted
request and tells the tenant; the worker does not reply for it.

Terminal replies: the admission app's dispatcher already turns every completion into
the tenant's terminal reply (it can tell a stale attempt from the live one), so the
worker sends none unless ``send_replies`` is set, to keep "exactly one terminal reply".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from triage.config.models import TriageConfig
from triage.kafka.clients import make_consumer, make_producer
from triage.kafka.security import use_kafka_security
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    ControlKind,
    ControlMessage,
    DeadLetter,
    GpuState,
    Reply,
    WorkItem,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode, ReplyStatus
from triage.topics.shards import shard_of_pool
from triage.workers.backends.base import AttemptResult, AttemptStatus, Backend, epoch_ms
from triage.workers.batching import CompletionBatcher
from triage.workers.delivery import BoundedIdSet, OffsetTracker, completed_work_ids
from triage.workers.errors import UnknownGpuError
from triage.workers.metrics import WorkerMetrics
from triage.workers.nvml import NvmlProbe, gpu_status, open_probe
from triage.workers.publish import AsyncProducer, DeliveryError
from triage.workers.stream import ChunkPublisher

log = logging.getLogger(__name__)
OUTAGE_TIMEOUT_MS = 600_000  # docs/reliability.md, "Broker outages"

_EARLY_CONTROLS = 10_000  # controls remembered for work items not seen yet
_SHUTDOWN = "worker shutting down"
Pos = tuple[str, int, int]  # topic, partition, offset


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """Where and how a worker runs; defaults come from the config."""

    bootstrap: str | None = None  # default: config.kafka.bootstrap_servers
    topics: TopicNames | None = None  # default: TopicNames(config.kafka.topic_prefix)
    metrics_port: int | None = None  # None: worker_port_base + GPU index; 0: any free port
    serve_metrics: bool = True
    send_replies: bool = False  # see the module docstring
    device_index: int = 0  # NVML device this worker probes
    drain_s: float = 10.0  # at shutdown, how long in-flight attempts may finish
    done_capacity: int = 100_000  # finished work ids remembered
    seed_tail: int = 20_000  # completions read back per partition at start


class Worker:
    """Runs until ``stop()`` (thread-safe) or a signal handler calls it."""

    def __init__(
        self,
        *,
        config: TriageConfig,
        gpu_id: str,
        backend: Backend,
        options: WorkerOptions | None = None,
    ) -> None:
        pool = config.pool_of_gpu(gpu_id)
        if pool is None:
            raise UnknownGpuError(
                f"unknown GPU {gpu_id!r}; configured GPUs: {', '.join(config.all_gpus())}"
            )
        self.config = config
        self.gpu_id = gpu_id
        self.pool = pool
        self.shard = shard_of_pool(config, pool.name)  # its completions' and heartbeats' partition
        self.backend = backend
        self.options = opts = options or WorkerOptions()
        self.bootstrap = opts.bootstrap or config.kafka.bootstrap_servers
        use_kafka_security(config.kafka, bootstrap=self.bootstrap)  # SASL/TLS, if configured
        self.topics = opts.topics or TopicNames.of(config.kafka.topic_prefix,
                                                    config.kafka.tenant_topics)
        self.metrics = WorkerMetrics(gpu_id)
        self.metrics_port: int | None = None
        self.ready = threading.Event()  # set once it consumes
        self.counts: collections.Counter[str] = collections.Counter()
        self.simulated = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self._stop_requested = False
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._abort_kind: dict[str, ControlKind | None] = {}  # None: shutdown
        self._early: collections.OrderedDict[str, ControlKind] = collections.OrderedDict()
        self._done = BoundedIdSet(opts.done_capacity)
        self._tracker = OffsetTracker()
        self._producer: AsyncProducer | None = None
        self._completions: CompletionBatcher | None = None
        self._probe: NvmlProbe | None = None

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the worker to finish (from any thread or a signal handler)."""
        self._stop_requested = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._stop.set)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._stop_requested:
            self._stop.set()
        consumer: Consumer | None = None
        beat: asyncio.Task[None] | None = None
        try:  # whatever was opened is closed by _shutdown, even if setup fails half way
            consumer = await self._setup()
            beat = asyncio.create_task(self._heartbeats(), name=f"heartbeat-{self.gpu_id}")
            self.ready.set()
            await self._consume(consumer, self.topics.gpu_work(self.gpu_id))
        finally:
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            await self._shutdown(consumer)

    async def _setup(self) -> Consumer:
        """Probe, start the backend, remember finished work, subscribe, serve metrics."""
        assert self._loop is not None
        opts = self.options
        self._probe = await asyncio.to_thread(open_probe, self.config, self.gpu_id,
                                              opts.device_index)  # fmt: skip
        self.simulated = self._probe is None
        await self.backend.start()
        # Results wait out a broker outage (librdkafka retries, idempotently) instead of
        # timing out after 30 s: a timed-out completion made the work run again.
        self._producer = AsyncProducer(make_producer(self.bootstrap, **{
            "message.timeout.ms": OUTAGE_TIMEOUT_MS}), self._loop)
        w = self.config.worker
        self._completions = CompletionBatcher(self._producer, self.topics.completions,
                                              self._loop, max_items=w.completion_batch_max,
                                              linger_s=w.completion_linger_ms / 1000.0,
                                              on_message=self.metrics.completion_messages
                                              .labels(self.gpu_id).inc,
                                              partition=self.shard)
        try:
            seeded = await asyncio.to_thread(completed_work_ids, self.bootstrap,
                                             self.topics.completions, self.gpu_id,
                                             tail=opts.seed_tail)  # fmt: skip
        except KafkaException as exc:  # rerunning a few items beats not starting at all
            log.warning("%s: could not read back %s (%s); redelivered work may rerun",
                        self.gpu_id, self.topics.completions, exc)  # fmt: skip
            seeded = []
        for wid in seeded:
            self._done.add(wid)
        log.info("%s: %d finished attempt(s) remembered from %s", self.gpu_id, len(seeded),
                 self.topics.completions)  # fmt: skip
        self._set_static_metrics()
        if opts.serve_metrics:
            port = opts.metrics_port
            if port is None:
                index = self.config.all_gpus().index(self.gpu_id)
                port = self.config.metrics.worker_port_base + index
            self.metrics_port = self.metrics.serve(self.config.metrics.host, port)
        consumer = make_consumer(self.bootstrap, f"triage-worker-{self.gpu_id}")
        work, control = self.topics.gpu_work(self.gpu_id), self.topics.gpu_control(self.gpu_id)
        consumer.subscribe([work, control], on_revoke=self._on_revoke)
        sim = ", simulated GPU" if self.simulated else ""
        log.info("%s: worker up (%s backend%s), consuming %s and %s", self.gpu_id,
                 self.backend.kind, sim, work, control)  # fmt: skip
        return consumer

    async def _consume(self, consumer: Consumer, work_topic: str) -> None:
        while not self._stop.is_set():
            msgs = await asyncio.to_thread(consumer.consume, 200, 0.1)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.debug("%s: consumer: %s", self.gpu_id, err)
                    continue
                pos: Pos = (msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
                self._tracker.received(*pos)
                if pos[0] == work_topic:
                    self._on_work(msg.value() or b"", msg.key(), pos)
                else:
                    await self._on_control(msg.value() or b"", msg.key(), pos)
            self._commit(consumer, asynchronous=True)

    async def _shutdown(self, consumer: Consumer | None) -> None:
        """Drain, abort what is left (reported as preempted), commit, flush, close."""
        log.info("%s: stopping; %d attempt(s) in flight", self.gpu_id, len(self._inflight))
        self._heartbeat(GpuState.DRAINING)
        if self._inflight:
            await asyncio.wait(list(self._inflight.values()), timeout=self.options.drain_s)
        left = list(self._inflight.items())
        for wid, _task in left:
            self._abort_kind[wid] = None
            await self.backend.abort(wid)
        if left:
            await asyncio.wait([t for _, t in left], timeout=10.0)
        if consumer is not None:
            await asyncio.to_thread(self._commit, consumer, False)
        self._heartbeat(GpuState.DOWN)
        if self._completions is not None:
            self._completions.flush()
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close)
        if consumer is not None:
            await asyncio.to_thread(consumer.close)
        await self.backend.close()
        if self._probe is not None:
            self._probe.close()
        self.metrics.close()
        log.info("%s: worker stopped (%s)", self.gpu_id, dict(self.counts))

    # ------------------------------------------------------------------ inputs

    def _on_work(self, value: bytes, key: bytes | None, pos: Pos) -> None:
        try:
            item = WorkItem.from_bytes(value)
        except ValueError as exc:
            self._dead_letter(value, key, pos, f"invalid WorkItem: {exc}")
            return
        wid = item.work_id
        if wid in self._done or wid in self._inflight:
            log.info("%s: %s already %s; skipped", self.gpu_id, wid,
                     "running" if wid in self._inflight else "ran")  # fmt: skip
            self.counts["duplicates"] += 1
            self.metrics.duplicates.labels(self.gpu_id).inc()
            self._tracker.finished(*pos)
            return
        if item.gpu_id != self.gpu_id:
            log.warning("%s: work item %s addressed to %s; running it here", self.gpu_id, wid,
                        item.gpu_id)  # fmt: skip
        early = self._early.pop(wid, None)
        if early is not None:
            self._abort_kind[wid] = early  # stopped before it arrived: report, do not run
        self._inflight[wid] = asyncio.create_task(self._execute(item, pos), name=wid)

    async def _on_control(self, value: bytes, key: bytes | None, pos: Pos) -> None:
        try:
            ctl = ControlMessage.from_bytes(value)
        except ValueError as exc:
            self._dead_letter(value, key, pos, f"invalid ControlMessage: {exc}")
            return
        wid = f"{ctl.request_id}#{ctl.attempt}"
        if wid in self._inflight:
            self._abort_kind[wid] = ctl.kind
            await self.backend.abort(wid)  # False: not in the backend yet; _execute checks
            log.info("%s: %s %s", self.gpu_id, ctl.kind.value, wid)
        elif wid in self._done:
            log.info("%s: %s for %s, which already ended; ignored", self.gpu_id, ctl.kind, wid)
        else:
            self._early[wid] = ctl.kind
            while len(self._early) > _EARLY_CONTROLS:
                self._early.popitem(last=False)
        self._tracker.finished(*pos)

    # ------------------------------------------------------------------ execution

    async def _execute(self, item: WorkItem, pos: Pos) -> None:
        wid = item.work_id
        try:
            sink = self._chunk_publisher(item)
            if wid in self._abort_kind:
                result = _not_run(AttemptStatus.ABORTED)
            else:
                try:
                    result = await self.backend.run(item, sink)
                except Exception as exc:  # a backend bug must not kill the worker
                    log.exception("%s: backend failed on %s", self.gpu_id, wid)
                    result = _not_run(AttemptStatus.FAILED, f"backend error: {exc}")
            if sink is not None:  # every chunk acknowledged before the completion goes
                await sink.close()
                self.metrics.stream_chunks.labels(self.gpu_id).inc(sink.chunks)
            kind = self._abort_kind.pop(wid, None)
            status = _status(result.status, kind)
            futures = [self._send_completion(item, result, status, kind)]
            if self.options.send_replies and status in (CompletionStatus.COMPLETED,
                                                        CompletionStatus.FAILED):  # fmt: skip
                futures.append(self._send_reply(item, result, status))
            try:
                await asyncio.gather(*futures)
            except DeliveryError as exc:
                log.error("%s: result of %s not delivered (%s); its offset stays uncommitted",
                          self.gpu_id, wid, exc)  # fmt: skip
                return
            self._done.add(wid)
            self._tracker.finished(*pos)
            self._count(item, result, status)
        finally:
            self._inflight.pop(wid, None)

    def _chunk_publisher(self, item: WorkItem) -> ChunkPublisher | None:
        """A sink for the attempt's tokens when the request asked to stream."""
        if not item.stream or self._producer is None:
            return None
        w = self.config.worker
        return ChunkPublisher(item=item, producer=self._producer,
                              topic=self.topics.replies(item.tenant), gpu_id=self.gpu_id,
                              chunk_tokens=w.stream_chunk_tokens,
                              chunk_ms=w.stream_chunk_ms)  # fmt: skip

    def _send_completion(
        self,
        item: WorkItem,
        r: AttemptResult,
        status: CompletionStatus,
        kind: ControlKind | None,
    ) -> asyncio.Future[None]:
        error = r.error
        if r.status is AttemptStatus.ABORTED and kind is None:
            error = _SHUTDOWN
        c = Completion(
            request_id=item.request_id, attempt=item.attempt, tenant=item.tenant,
            model=item.model, pool=item.pool, gpu_id=self.gpu_id,
            gpu_type=self.pool.gpu_type, status=status, prompt_tokens=item.prompt_tokens,
            output_tokens=max(0, r.output_tokens), max_tokens=item.max_tokens,
            prefill_s=max(0.0, r.prefill_s), decode_s=max(0.0, r.decode_s),
            queue_s=max(0.0, r.queue_s), mean_concurrency=max(0.0, r.mean_concurrency),
            started_at_ms=r.started_at_ms,
            finished_at_ms=max(r.started_at_ms, r.finished_at_ms), error=error, text=r.text,
        )  # fmt: skip
        assert self._completions is not None
        return self._completions.send(item.pool, c)

    def _send_reply(
        self, item: WorkItem, r: AttemptResult, status: CompletionStatus
    ) -> asyncio.Future[None]:
        ok = status is CompletionStatus.COMPLETED
        reply = Reply(
            request_id=item.request_id, tenant=item.tenant,
            status=ReplyStatus.COMPLETED if ok else ReplyStatus.FAILED,
            reason=ReasonCode.COMPLETED if ok else ReasonCode.FAILED,
            detail=None if ok else (r.error or "failed")[:2000], gpu_id=self.gpu_id,
            latency_ms=float(max(0, r.finished_at_ms - item.arrived_at_ms)),
            output_tokens=max(0, r.output_tokens), text=r.text, at_ms=r.finished_at_ms,
        )  # fmt: skip
        assert self._producer is not None
        return self._producer.send(self.topics.replies(item.tenant), item.request_id, reply)

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeats(self) -> None:
        while True:
            self._heartbeat(GpuState.UP)
            await asyncio.sleep(self.config.worker.heartbeat_s)

    def _heartbeat(self, state: GpuState) -> None:
        if self._producer is None:
            return
        reading = self._probe.read() if self._probe is not None else None
        load = self.backend.load()
        status = gpu_status(config=self.config, gpu_id=self.gpu_id, reading=reading,
                            load=load, at_ms=epoch_ms(), state=state)  # fmt: skip
        fut = self._producer.send(self.topics.gpu_status, self.gpu_id, status, self.shard)
        fut.add_done_callback(_log_failure)
        m, g = self.metrics, self.gpu_id
        m.heartbeats.labels(g).inc()
        m.running.labels(g).set(load.running)
        if load.kv_usage is not None:
            m.kv_usage.labels(g).set(load.kv_usage)
        m.waiting.labels(g).set(load.waiting)
        m.utilization.labels(g).set(status.utilization)
        m.healthy.labels(g).set(1.0 if status.healthy else 0.0)
        if status.memory_used_bytes is not None:
            m.kv_bytes.labels(g).set(status.memory_used_bytes)

    # ------------------------------------------------------------------ helpers

    def _commit(self, consumer: Consumer, asynchronous: bool) -> None:
        offsets = self._tracker.committable()
        if not offsets:
            return
        try:
            if asynchronous:
                consumer.commit(offsets=offsets, asynchronous=True)
            else:
                consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # e.g. partitions revoked meanwhile: redelivery covers it
            log.warning("%s: commit failed: %s", self.gpu_id, exc)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit(consumer, asynchronous=False)
        self._tracker.forget(partitions)

    def _dead_letter(self, value: bytes, key: bytes | None, pos: Pos, error: str) -> None:
        log.error("%s: %s at %s[%d]@%d", self.gpu_id, error[:300], *pos)
        dl = DeadLetter.of(source_topic=pos[0], partition=pos[1], offset=pos[2], key=key,
                           value=value, error=error, stage="worker", at_ms=epoch_ms())
        assert self._producer is not None
        fut = self._producer.send(self.topics.deadletter, dl.key or "", dl)
        fut.add_done_callback(lambda f: self._tracker.finished(*pos) if not f.exception() else None)

    def _set_static_metrics(self) -> None:
        g = self.gpu_id
        self.metrics.kv_budget.labels(g).set(self.pool.kv_budget_gib * 1024**3)
        self.metrics.simulated.labels(g).set(1.0 if self.simulated else 0.0)

    def _count(self, item: WorkItem, r: AttemptResult, status: CompletionStatus) -> None:
        self.counts[status.value] += 1
        m, g = self.metrics, self.gpu_id
        m.attempts.labels(g, item.tenant, item.model, status.value).inc()
        m.output_tokens.labels(g, item.tenant, item.model).inc(max(0, r.output_tokens))
        if status is CompletionStatus.COMPLETED:
            m.prefill.labels(g, item.model).observe(max(0.0, r.prefill_s))
            m.decode.labels(g, item.model).observe(max(0.0, r.decode_s))
            if r.first_token_at_ms is not None:
                ttft = max(0, r.first_token_at_ms - item.arrived_at_ms) / 1000.0
                m.ttft.labels(g, item.model).observe(ttft)


async def run_worker(
    config: TriageConfig,
    gpu_id: str,
    backend: Backend,
    *,
    options: WorkerOptions | None = None,
    handle_signals: bool = False,
) -> Worker:
    """Run a worker until stopped; with ``handle_signals``, SIGTERM/SIGINT stop it cleanly."""
    import signal

    worker = Worker(config=config, gpu_id=gpu_id, backend=backend, options=options)
    if handle_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
    await worker.run()
    return worker


def _status(status: AttemptStatus, kind: ControlKind | None) -> CompletionStatus:
    if status is AttemptStatus.COMPLETED:
        return CompletionStatus.COMPLETED
    if status is AttemptStatus.FAILED:
        return CompletionStatus.FAILED
    return CompletionStatus.CANCELLED if kind is ControlKind.CANCEL else CompletionStatus.PREEMPTED


def _not_run(status: AttemptStatus, error: str | None = None) -> AttemptResult:
    now = epoch_ms()
    return AttemptResult(status=status, output_tokens=0, prefill_s=0.0, decode_s=0.0,
                         mean_concurrency=0.0, started_at_ms=now, finished_at_ms=now,
                         error=error)  # fmt: skip


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("heartbeat not delivered: %s", fut.exception())
