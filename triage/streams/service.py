"""The admission service: Kafka events in, core calls, outputs and state writes out.

No Faust here: the Faust app (app.py) feeds these handlers from its agents and
timer, with an Outbox for outputs and a StateStore over its RocksDB tables. Unit
tests feed the same handlers with a list outbox and a dict store. No policy here
either: every decision is the core's.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from triage.admission.core import AdmissionCore
from triage.admission.decision import Decision
from triage.admission.pending import Pending
from triage.config.models import TenantConfig, TriageConfig
from triage.streams import codec
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import Outbox
from triage.streams.refusals import FailureLog, Refusals
from triage.streams.store import Bucket, StateStore
from triage.topics.messages import (
    BucketState,
    ChatMessage,
    Completion,
    CompletionStatus,
    DeadLetterStage,
    GpuState,
    GpuStatus,
    LiveRequest,
    LiveState,
    completions_in,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import Outcome, ReasonCode
from triage.topics.shards import Shard, shard_of_pool
from triage.topics.validation import Invalid, Unparseable, check_request, parse_request

log = logging.getLogger(__name__)

LEARNED_KEY = "predictor"
LEARNED_EVERY_S = 10.0
MEMORY_REASONS = frozenset({
    ReasonCode.GPU_MEMORY_INSUFFICIENT, ReasonCode.RESERVATION_FLOOR, ReasonCode.NO_CAPACITY,
    ReasonCode.TIGHTENED,
})
_LIVE_STATE = {Outcome.ACCEPT: LiveState.RUNNING, Outcome.QUEUE: LiveState.QUEUED,
               Outcome.PREEMPT: LiveState.QUEUED}


class _Side:
    """What the shell keeps about a live request beside the core's Pending."""

    __slots__ = ("messages", "metadata", "prompt", "queued_for", "stream")

    def __init__(
        self, prompt: str | None, metadata: dict[str, str], stream: bool,
        messages: list[ChatMessage] | None,
    ) -> None:
        self.prompt = prompt
        self.metadata = metadata
        self.stream = stream  # the worker streams token chunks to the tenant
        # a chat prompt, JSON-ready for the work item and the table record
        self.messages = (None if messages is None else
                         [m.model_dump(exclude_none=True) for m in messages])
        self.queued_for: ReasonCode | None = None  # first reason it waited (SLA causes)


class AdmissionService:
    """Handlers for every input of the admission app."""

    def __init__(
        self, config: TriageConfig, *, names: TopicNames, outbox: Outbox, store: StateStore,
        metrics: AdmissionMetrics | None = None, expect_heartbeats: bool = True,
        shard: Shard | None = None,
    ) -> None:
        """`shard`: the one partition of a sharded app this service decides for (its
        pools; the store is then that shard's view). None: every pool."""
        self.config = config
        self.shard = shard
        self.names = names
        self.outbox = outbox
        self.store = store
        store.carry_outputs(outbox.pending_for)  # every record carries its uncommitted outputs
        self.metrics = metrics or AdmissionMetrics()
        self.expect_heartbeats = expect_heartbeats
        self.core = self._new_core()
        self._side: dict[str, _Side] = {}
        self._done: deque[tuple[float, str]] = deque()  # dedupe records, oldest first
        self._dirty_buckets: set[str] = set()
        self._texts: dict[str, str] = {}
        self._learned_at = 0.0
        self._op = 0  # orders bucket snapshots within one process (see store.Bucket)
        self.dedupe_ttl_s = config.admission.dedupe_ttl_s
        self._refusals = Refusals(names=names, outbox=outbox, store=store, metrics=self.metrics,
                                  done=self._done,
                                  keep_bytes=config.admission.deadletter_value_bytes)
        self._withdrawn: list[tuple[LiveRequest, ReasonCode, str]] = []
        self._next_config: TriageConfig | None = None
        self._failures = FailureLog(self.metrics)

    # --- recovery -------------------------------------------------------------------
    def _new_core(self) -> AdmissionCore:
        return AdmissionCore(self.config, expect_heartbeats=self.expect_heartbeats,
                             pools=None if self.shard is None else self.shard.pools)

    def restore(self, now: float, *, replay: bool = True,
                committed: int | None = None) -> dict[str, int]:
        """Rebuild the core and the in-memory indexes from the tables (after recovery).
        `replay=False` while running (a tenant removed): unconfirmed outputs are still
        on their way in the outbox's own batches, so they are not staged again.
        `committed`: the last batch committed for this service's shard, when the shard
        is taken over mid-run (its records name another owner's batches); None: the
        outbox's own, read at its start."""
        self.core = self._new_core()
        self._side.clear()
        self._done.clear()
        counts = {"buckets": 0, "queued": 0, "running": 0, "done": 0, "requeued": 0,
                  "replayed": 0}
        newest: dict[str, Bucket] = dict(self.store.buckets())
        learned = self.store.get_learned(LEARNED_KEY)
        if learned:
            self.core.predictor.restore(learned)
        done: list[tuple[float, str]] = []
        self._withdrawn.clear()
        envelopes = list(self.store.envelopes())
        highest = max((b.stamp[0] for b in newest.values()), default=0)
        for _rid, env in envelopes:
            highest = max(highest, env.tenant_bucket.stamp[0] if env.tenant_bucket else 0,
                          *(seq for seq, _, _ in env.outputs))
        if replay:  # batches are numbered above anything stored; uncommitted outputs again
            if committed is None:
                self.outbox.resume_after(self.outbox.confirmed, highest)
            else:
                self.outbox.advance_past(max(highest, committed))
            for rid, env in envelopes:
                counts["replayed"] += self.outbox.replay(rid, env.outputs, committed)
        for _rid, env in envelopes:
            rec = LiveRequest.from_bytes(env.record)
            b = env.tenant_bucket
            if b is not None and (rec.tenant not in newest or b.stamp > newest[rec.tenant].stamp):
                newest[rec.tenant] = b
            if rec.state is LiveState.DONE:
                done.append((rec.updated, rec.request_id))
                continue
            d = self.core.dispatchers.get(rec.pool)
            if rec.tenant not in self.core.gate.quotas:  # answered at the next tick
                self._withdrawn.append((rec, ReasonCode.UNKNOWN_TENANT,
                                        f"tenant {rec.tenant!r} was removed from the "
                                        "configuration"))
                continue
            if d is None:
                self._withdrawn.append((rec, ReasonCode.NO_CAPACITY,
                                        f"pool {rec.pool!r} was removed from the configuration"))
                continue
            p = codec.pending_from(rec)
            self._side[rec.request_id] = _Side(rec.prompt, dict(rec.metadata), rec.stream,
                                                rec.messages)
            if rec.state is LiveState.RUNNING and rec.gpu_id and d.restore_running(p, rec.gpu_id):
                counts["running"] += 1
            elif rec.state is LiveState.RUNNING:
                counts["requeued"] += 1  # its GPU is gone from the config: wait again
                p.attempt += 1
                p.enqueued_at = now
                d.restore_queued(p)
            else:
                d.restore_queued(p)
                counts["queued"] += 1
        for tenant, b in newest.items():
            if tenant in self.core.gate.quotas:
                self.core.gate.bucket(tenant).restore({"level": b.level, "updated": b.updated})
                counts["buckets"] += 1
        done.sort()
        self._done.extend(done)
        counts["done"] = len(done)
        counts["withdrawn"] = len(self._withdrawn)
        log.info("restored admission state: %s", counts)
        self.metrics.ready.set(1)
        return counts

    def add_tenant(self, tenant: TenantConfig) -> None:
        self.core.add_tenant(tenant)

    def reconfigure(self, config: TriageConfig) -> None:
        """Adopt a new tenant list at the next tick (inside an event, where tables may be
        written). Added tenants join the running core; if any was removed the core is
        rebuilt from the tables, as after a restart, and the removed tenants' live
        requests are answered `rejected` (`unknown_tenant`)."""
        self._next_config = config

    def _apply_config(self, now: float) -> None:
        config, self._next_config = self._next_config, None
        if config is None:
            return
        removed = set(self.config.tenants_by_name) - set(config.tenants_by_name)
        added = [t for t in config.tenants if t.name not in self.config.tenants_by_name]
        self.config = config
        if removed:
            self._flush_buckets()
            self.store.put_learned(LEARNED_KEY, self.core.predictor.snapshot())
            self.restore(now, replay=False)
        else:
            for t in added:
                self.add_tenant(t)
        log.info("configuration changed: tenants added %s, removed %s",
                 sorted(t.name for t in added), sorted(removed))

    def _answer_withdrawn(self, now: float) -> None:
        withdrawn, self._withdrawn = self._withdrawn, []
        for rec, reason, detail in withdrawn:
            self._refusals.withdraw(rec, reason, detail, policy=self._policy(), now=now)

    def _policy(self) -> tuple[str, str]:
        return self.core.flags.name, self.core.flags.version

    # --- inputs -----------------------------------------------------------------------
    def on_request(
        self, *, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
        offset: int | None, now: float,
    ) -> None:
        """A message on a tenant's request topic. Never raises: a message that breaks its
        handler is dead-lettered (and answered `invalid` when it names a fresh id) with a
        log line, and the next message is served."""
        try:
            self._on_request(topic, key, value, partition, offset, now)
        except Exception as exc:
            self._failed("request", "gate", topic, exc, key, value, partition, offset, now)

    def _failed(
        self, handler: str, stage: DeadLetterStage, topic: str, exc: Exception,
        key: bytes | None, value: bytes | None, partition: int | None, offset: int | None,
        now: float,
    ) -> None:
        self._failures.log(handler, exc, topic, partition, offset)
        self._refusals.failed(exc, topic=topic, partition=partition, offset=offset, key=key,
                              value=value, stage=stage, now=now,
                              live_in_core=lambda rid: self.core.live(rid), policy=self._policy)

    def _on_request(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
        offset: int | None, now: float,
    ) -> None:
        tenant = self.names.tenant_of_request_topic(topic) or "unknown"
        parsed = parse_request(value, max_bytes=self.config.admission.max_message_bytes)
        if not isinstance(parsed, (Unparseable, Invalid)) and self._forwarded(
            topic, partition, key, value or b"", self._pool_of_model(parsed.model)
        ):
            return
        self.metrics.child(self.metrics.requests, tenant).inc()
        if isinstance(parsed, Unparseable):
            self._refusals.dead_letter(topic, partition, offset, key, value, parsed.error,
                                       "gate", now)
            self.metrics.invalid.labels(tenant, "unparseable").inc()
            return
        if isinstance(parsed, Invalid):
            self._invalid(tenant, parsed, topic, partition, offset, key, value, now)
            return
        req = parsed
        problem = check_request(req, self.config, tenant)
        if problem is not None:
            self._invalid(tenant, problem, topic, partition, offset, key, value, now)
            return
        rid = req.request_id
        known = self.store.get_request(rid) if self.store.has_request(rid) else None
        if known is not None or self.core.live(rid):
            # A redelivery, or the id reused. A live request's last (non-terminal) reply
            # is sent again; a finished one's terminal reply never is: one per id.
            self.metrics.duplicates.labels(tenant).inc()
            if known is not None and known.state is not LiveState.DONE \
                    and known.last_reply is not None:
                self.outbox.send(self.names.replies(tenant), rid, known.last_reply)
            return
        t0 = time.perf_counter()
        core = self.core
        p = core.make_pending(
            rid, req.tenant, req.model, req.prompt_tokens, req.max_tokens, now,
            None if req.sla_ms is None else req.sla_ms / 1000.0,
            None if req.created_at_ms is None else req.created_at_ms / 1000.0,
        )
        decisions = core.admit(p, now)
        self.metrics.child(self.metrics.decision_latency, "request").observe(
            time.perf_counter() - t0)
        self._dirty_buckets.add(req.tenant)
        self._side[rid] = _Side(req.prompt, dict(req.metadata), req.stream, req.messages)
        self._emit(decisions, now, arrival=p)

    def _pool_of_model(self, model: str) -> str | None:
        m = self.config.models_by_name.get(model)
        return None if m is None else m.pool

    def _forwarded(self, topic: str, partition: int | None, key: bytes | None, value: bytes,
                   pool: str | None) -> bool:
        """A sharded app's input for a configured pool of another shard (a producer that
        did not route it): sent on to that shard's partition, in this batch."""
        if self.shard is None or pool is None or pool in self.shard.pools \
                or pool not in self.config.pools_by_name:
            return False
        target = shard_of_pool(self.config, pool)
        if target == partition:
            return False  # on its own partition already: the config changed under it
        self.outbox.forward(topic, target, key, value)
        self.metrics.forwarded.labels(topic).inc()
        return True

    def on_completion(self, value: bytes | None, *, key: bytes | None = None,
                      partition: int | None = None, offset: int | None = None,
                      now: float) -> None:
        """A worker finished (or stopped) attempts: one Completion, or a CompletionBatch.
        Never raises (as on_request); an item that fails is dead-lettered on its own, the
        rest of its batch still counts."""
        try:
            done = completions_in(value or b"")
        except ValueError as exc:
            self._refusals.dead_letter(self.names.completions, partition, offset, key, value,
                                       str(exc), "completions", now)
            return
        except Exception as exc:
            self._failed("completion", "completions", self.names.completions, exc, key, value,
                         partition, offset, now)
            return
        for c in done:
            try:
                self._on_completion(c, now)
            except Exception as exc:
                raw = value if len(done) == 1 else c.to_bytes()
                self._failed("completion", "completions", self.names.completions, exc, key,
                             raw, partition, offset, now)

    def _on_completion(self, c: Completion, now: float) -> None:
        d = self.core.dispatchers.get(c.pool)
        if d is None and self._forwarded(self.names.completions, None, c.request_id.encode(),
                                         c.to_bytes(), c.pool):
            return
        if d is None:
            log.warning("completion for unknown pool %r (%s)", c.pool, c.request_id)
            return
        p = d.inflight.get(c.request_id)
        if c.text is not None:
            self._texts[c.request_id] = c.text
        ok = c.status is CompletionStatus.COMPLETED
        t0 = time.perf_counter()
        decisions = self.core.complete(
            pool=c.pool, request_id=c.request_id, attempt=c.attempt, ok=ok,
            output_tokens=c.output_tokens,
            prefill_s=c.prefill_s, decode_s=c.decode_s, concurrency=c.mean_concurrency,
            now=now, preempted=c.status in (CompletionStatus.PREEMPTED, CompletionStatus.CANCELLED),
            error=c.error,
        )
        self.metrics.child(self.metrics.decision_latency, "completion").observe(
            time.perf_counter() - t0)
        if ok and p is not None and p.attempt == c.attempt and p.predicted_raw_s > 0:
            self.metrics.child(self.metrics.predictor_error, c.model).observe(
                (c.prefill_s + c.decode_s) / p.predicted_raw_s
            )
        if not decisions:  # a stale or duplicate completion: nothing will carry its text
            self._texts.pop(c.request_id, None)
        self._emit(decisions, now, finished=p)

    def on_status(self, value: bytes | None, *, key: bytes | None = None,
                  partition: int | None = None, offset: int | None = None,
                  now: float) -> None:
        """A GPU heartbeat: capacity, utilization, health, joins and departures. Never
        raises (as on_request)."""
        try:
            self._on_status(value, key, partition, offset, now)
        except Exception as exc:
            self._failed("status", "status", self.names.gpu_status, exc, key, value,
                         partition, offset, now)

    def _on_status(self, value: bytes | None, key: bytes | None, partition: int | None,
                   offset: int | None, now: float) -> None:
        try:
            st = GpuStatus.from_bytes(value or b"")
        except ValueError as exc:
            self._refusals.dead_letter(self.names.gpu_status, partition, offset, key, value,
                                       str(exc), "status", now)
            return
        d = self.core.dispatchers.get(st.pool)
        if d is None and self._forwarded(self.names.gpu_status, partition, key, value or b"",
                                         st.pool):
            return
        if d is None:
            log.warning("heartbeat from %s for unknown pool %r", st.gpu_id, st.pool)
            return
        gt = self.config.gpu_types_by_name.get(st.gpu_type)
        decisions = self.core.heartbeat(
            pool=st.pool, gpu_id=st.gpu_id, gpu_type=st.gpu_type, speed=gt.speed if gt else 1.0,
            kv_budget=st.kv_budget_bytes,
            up=st.state is GpuState.UP and st.healthy, now=now,
        )
        self.metrics.gpu_utilization.labels(st.pool, st.gpu_id).set(st.utilization)
        self._emit(decisions, now)

    def on_tick(self, now: float) -> None:
        """Timeouts, dispatch, hysteresis; then write state that is kept behind. Never
        raises: a failure is logged and counted, and the next tick runs."""
        try:
            self._on_tick(now)
        except Exception as exc:
            self._failures.log("tick", exc, self.names.admission, None, None)

    def _on_tick(self, now: float) -> None:
        self._apply_config(now)
        if self._withdrawn:
            self._answer_withdrawn(now)
        t0 = time.perf_counter()
        decisions = self.core.tick(now)
        self.metrics.decision_latency.labels("tick").observe(time.perf_counter() - t0)
        self._emit(decisions, now)
        for e in self.core.drain_scale_events():
            self.outbox.send(self.names.autoscale, e.pool, codec.scale_signal(e))
        self._flush_buckets()
        if now - self._learned_at >= LEARNED_EVERY_S:
            self._learned_at = now
            self.store.put_learned(LEARNED_KEY, self.core.predictor.snapshot())
        self._expire_done(now)
        self._observe_gauges()

    # --- outputs ----------------------------------------------------------------------
    def _emit(self, decisions: list[Decision], now: float, arrival: Pending | None = None,
              finished: Pending | None = None) -> None:
        """Each decision's outputs and table record. `arrival` is the request just read;
        `finished` the one a completion just ended (the core has let go of it: its done
        record is built from it rather than read back from the table)."""
        names = self.names
        out = self.outbox
        m = self.metrics
        for d in decisions:
            rid = d.request_id
            key = rid.encode()
            p = arrival if arrival is not None and arrival.request_id == rid else None
            out.send_raw(names.decisions, key, codec.decision_record(d, p))
            m.child(m.admissions, d.tenant, d.model, d.outcome.value, d.reason.value).inc()
            if p is None and d.pool is not None:
                disp = self.core.dispatchers[d.pool]
                p = disp.inflight.get(rid) or disp.queue.members.get(rid)
            if p is None and finished is not None and finished.request_id == rid \
                    and d.outcome is Outcome.COMPLETE:
                p = finished
            side = self._side.get(rid)
            text = self._texts.pop(rid, None) if d.outcome is Outcome.COMPLETE else None
            reply = codec.reply_for(d, text=text)
            if d.outcome is Outcome.ACCEPT and p is not None:
                gpu, item = codec.work_item(d, p, prompt=side.prompt if side else None,
                                            metadata=side.metadata if side else {},
                                            stream=side.stream if side else False,
                                            messages=side.messages if side else None)
                out.send_raw(names.gpu_work(gpu), key, item)
                if p.enqueued_at >= 0.0 and d.queue_wait_s is not None:
                    m.child(m.queue_wait, d.tenant, d.model).observe(d.queue_wait_s)
            elif d.outcome is Outcome.PREEMPT:
                m.child(m.preemptions, d.tenant, d.model).inc()
                m.child(m.recompute_tokens, d.tenant, d.model).inc(d.recompute_tokens or 0)
            elif d.outcome is Outcome.QUEUE and side is not None and side.queued_for is None:
                side.queued_for = d.reason
            control = codec.control_for(d)
            if control is not None:
                out.send(names.gpu_control(control.gpu_id), rid, control)
            out.send_raw(names.replies(d.tenant), key, codec.reply_bytes(reply))
            state = _LIVE_STATE.get(d.outcome)
            if state is not None and p is not None:
                self._put_record(rid, d.tenant, codec.live_record(
                    p, state, prompt=side.prompt if side else None,
                    metadata=side.metadata if side else {}, last_reply=reply, now=now,
                    stream=side.stream if side else False,
                    messages=side.messages if side else None))
            else:
                self._finish(d, p, side, reply, now)

    def _finish(
        self, d: Decision, p: Pending | None, side: _Side | None, reply: dict[str, Any],
        now: float,
    ) -> None:
        """A terminal decision: keep a dedupe record, count SLA misses, forget the rest."""
        m = self.metrics
        self._side.pop(d.request_id, None)
        if d.outcome is Outcome.COMPLETE:
            sla = d.sla_s
            if d.latency_s is not None:
                m.child(m.latency, d.tenant, d.model).observe(d.latency_s)
            if sla is not None and d.latency_s is not None and d.latency_s > sla:
                self._violation(d, side)
        elif d.outcome is Outcome.TIMEOUT:
            m.child(m.queue_timeouts, d.tenant, d.model, d.reason.value).inc()
            if d.queue_wait_s is not None:
                m.child(m.queue_wait, d.tenant, d.model).observe(d.queue_wait_s)
            self._violation(d, side)
        if p is not None:
            rec = codec.live_record(p, LiveState.DONE, prompt=None, metadata={},
                                    last_reply=reply, now=now)
        else:
            prev = self.store.get_request_raw(d.request_id)
            if prev is None:
                return
            rec = codec.finished_record(prev, reply, now)
        self._put_record(d.request_id, d.tenant, rec)
        self._done.append((now, d.request_id))

    def _put_record(self, rid: str, tenant: str, raw: bytes) -> None:
        """Write a request's record with the outputs it caused that are not committed yet
        and its tenant's bucket as this decision left it (crash safety: both are durable
        at the same point as the record; see outbox.py and store.py)."""
        bucket = None
        if tenant in self.core.gate.quotas:
            self._op += 1
            bk = self.core.gate.bucket(tenant)
            bucket = Bucket(bk.level, bk.updated, (self.outbox.seq, self._op))
        self.store.put_request_raw(rid, raw, bucket=bucket)

    def _violation(self, d: Decision, side: _Side | None) -> None:
        queued_for = side.queued_for if side else None
        if queued_for in MEMORY_REASONS:
            cause = "memory_pressure"
        elif queued_for is not None or d.outcome is Outcome.TIMEOUT:
            cause = "queueing"
        else:
            cause = "compute_saturation"
        self.metrics.child(self.metrics.sla_violations, d.tenant, d.model, cause).inc()

    def _invalid(
        self, tenant: str, problem: Invalid, topic: str, partition: int | None,
        offset: int | None, key: bytes | None, value: bytes | None, now: float,
    ) -> None:
        self._refusals.invalid(tenant, problem, live_in_core=self.core.live(problem.request_id),
                               policy=self._policy(), topic=topic, partition=partition,
                               offset=offset, key=key, value=value, now=now)

    # --- kept-behind state and gauges -------------------------------------------------
    def _flush_buckets(self) -> None:
        for tenant in self._dirty_buckets:
            b = self.core.gate.bucket(tenant)
            self._op += 1
            self.store.put_bucket(tenant, BucketState(level=b.level, updated=b.updated),
                                  (self.outbox.seq, self._op))
            self.metrics.bucket_level.labels(tenant).set(b.level)
        self._dirty_buckets.clear()

    def _expire_done(self, now: float) -> None:
        horizon = now - self.dedupe_ttl_s
        done = self._done
        while done and done[0][0] < horizon:
            _, rid = done.popleft()
            rec = self.store.get_request(rid)
            if rec is not None and rec.state is LiveState.DONE and rec.updated < horizon:
                self.store.delete_request(rid)

    def _observe_gauges(self) -> None:
        self.metrics.observe_core(self.core, self.config.tenants_by_name)
