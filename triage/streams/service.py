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

from triage.admission.core import AdmissionCore
from triage.config.models import TenantConfig, TriageConfig
from triage.streams import codec
from triage.streams.emitting import RequestSide, ServiceOutputs
from triage.streams.forwarding import Forwarder
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import Committed, Outbox
from triage.streams.refusals import FailureLog, Refusals
from triage.streams.store import Bucket, StateStore
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    DeadLetterStage,
    GpuState,
    GpuStatus,
    InferenceRequest,
    LiveRequest,
    LiveState,
    completions_in,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode
from triage.topics.shards import (
    Origin,
    Shard,
    is_verdict,
    origin_of,
)
from triage.topics.validation import Invalid, Unparseable, check_request, parse_request

log = logging.getLogger(__name__)

LEARNED_KEY = "predictor"
LEARNED_EVERY_S = 10.0
# gauges sample the core this often, not every tick (per-tenant depths at 1,000 tenants
# cost ~5% of the event loop's samples at 20 ticks a second)
GAUGES_EVERY_S = 1.0


class AdmissionService(ServiceOutputs):
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
        self.shard_index = 0 if shard is None else shard.index
        self.names = names
        self.outbox = outbox
        self.store = store
        store.carry_outputs(outbox.pending_for)  # every record carries its uncommitted outputs
        self.metrics = metrics or AdmissionMetrics()
        self.expect_heartbeats = expect_heartbeats
        self.core = self._new_core()
        self._side: dict[str, RequestSide] = {}
        self._done: deque[tuple[float, str]] = deque()  # dedupe records, oldest first
        self._dirty_buckets: set[str] = set()
        self._texts: dict[str, str] = {}
        self._learned_at = 0.0
        self._gauges_at = float("-inf")  # the first tick sets them
        self._op = 0  # orders bucket snapshots within one process (see store.Bucket)
        self.dedupe_ttl_s = config.admission.dedupe_ttl_s
        self._refusals = Refusals(names=names, outbox=outbox, store=store, metrics=self.metrics,
                                  done=self._done,
                                  keep_bytes=config.admission.deadletter_value_bytes)
        self._forward = Forwarder(outbox, self.metrics, self._refusals)
        self._withdrawn: list[tuple[LiveRequest, ReasonCode, str]] = []
        self._next_config: TriageConfig | None = None
        self._failures = FailureLog(self.metrics)

    # --- recovery -------------------------------------------------------------------
    def _new_core(self) -> AdmissionCore:
        return AdmissionCore(self.config, expect_heartbeats=self.expect_heartbeats,
                             pools=None if self.shard is None else self.shard.pools)

    def restore(self, now: float, *, replay: bool = True,
                committed: int | Committed | None = None) -> dict[str, int]:
        """Rebuild the core and the in-memory indexes from the tables (after recovery).
        `replay=False` while running (a tenant removed): unconfirmed outputs are still
        on their way in the outbox's own batches, so they are not staged again.
        `committed`: the last batches committed for this service's shard (per lane),
        when the shard is taken over mid-run (its records name another owner's
        batches); None: the outbox's own, read at its start."""
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
                self.outbox.resume_after(self.outbox.lane_confirmed, highest)
            else:
                self.outbox.advance_past(max(highest, Committed.of(committed).high))
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
            self._side[rec.request_id] = RequestSide(rec.prompt, dict(rec.metadata), rec.stream,
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
        offset: int | None, now: float, headers: object = None,
    ) -> None:
        """A message on a tenant's request topic. Never raises: a message that breaks its
        handler is dead-lettered (and answered `invalid` when it names a fresh id) with a
        log line, and the next message is served. `headers`: a forward's (sharding) say
        where it was first read (dead letters and logs name that record), or that it is
        an InvalidVerdict."""
        origin = origin_of(headers)
        try:
            if is_verdict(headers) and self._forward.answer_verdict(
                    topic, key, value, origin, now, self.core.live, self._policy()):
                return
            self._on_request(topic, key, value, partition, offset, now, origin)
        except Exception as exc:
            partition, offset = origin or (partition, offset)
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
        offset: int | None, now: float, origin: Origin | None,
    ) -> None:
        topic_tenant = self.names.tenant_of_request_topic(topic)
        parsed = parse_request(value, max_bytes=self.config.admission.max_message_bytes)
        tenant = topic_tenant or self._tenant_named(parsed)
        # an invalid message is answered by its model's shard too: only that shard knows
        # whether its id is fresh (one terminal reply per id)
        if origin is None and partition is not None and offset is not None:
            origin = partition, offset
        if not isinstance(parsed, Unparseable) and self._forward.request(
                self.config, self.shard, topic, partition, key, value or b"", parsed, origin,
                now):
            return
        if origin is not None:
            partition, offset = origin
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
        problem = check_request(req, self.config, topic_tenant)
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
        self._side[rid] = RequestSide(req.prompt, dict(req.metadata), req.stream, req.messages)
        self._emit(decisions, now, arrival=p)

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
        if d is None and self._forward.send(self.config, self.shard, self.names.completions,
                                            None, c.request_id.encode(), c.to_bytes(), c.pool):
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
        if d is None and self._forward.send(self.config, self.shard, self.names.gpu_status,
                                            partition, key, value or b"", st.pool):
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
        if now - self._gauges_at >= GAUGES_EVERY_S:
            self._gauges_at = now
            self._observe_gauges()

    def _tenant_named(self, parsed: object) -> str:
        """On the shared request topic, the configured tenant a request names (anything
        else, `unknown`: a metric label per stray name would grow without bound)."""
        named = parsed.tenant if isinstance(parsed, InferenceRequest) else None
        return named if named is not None and self.config.tenant(named) is not None \
            else "unknown"

    def _invalid(
        self, tenant: str, problem: Invalid, topic: str, partition: int | None,
        offset: int | None, key: bytes | None, value: bytes | None, now: float,
    ) -> None:
        self._refusals.invalid(tenant, problem, live_in_core=self.core.live(problem.request_id),
                               policy=self._policy(), topic=topic, partition=partition,
                               offset=offset, key=key, value=value, now=now)
