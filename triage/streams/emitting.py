"""What the admission service sends and writes for each decision: the outputs (replies,
decisions, work items, controls), the request's table record with its bucket, the
dedupe records and the buckets kept behind. Split from service.py (the handlers of
inputs), which builds on it."""

from __future__ import annotations

from collections import deque
from typing import Any

from triage.admission.core import AdmissionCore
from triage.admission.decision import Decision
from triage.admission.pending import Pending
from triage.config.models import TriageConfig
from triage.streams import codec
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import Outbox
from triage.streams.store import Bucket, StateStore
from triage.topics.messages import BucketState, ChatMessage, LiveState
from triage.topics.names import TopicNames
from triage.topics.reasons import Outcome, ReasonCode, stopped_running

MEMORY_REASONS = frozenset({
    ReasonCode.GPU_MEMORY_INSUFFICIENT, ReasonCode.RESERVATION_FLOOR, ReasonCode.NO_CAPACITY,
    ReasonCode.TIGHTENED,
})
_LIVE_STATE = {Outcome.ACCEPT: LiveState.RUNNING, Outcome.QUEUE: LiveState.QUEUED,
               Outcome.PREEMPT: LiveState.QUEUED}


class RequestSide:
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


class ServiceOutputs:
    """The output half of AdmissionService (its attributes are set there)."""

    config: TriageConfig
    names: TopicNames
    outbox: Outbox
    store: StateStore
    metrics: AdmissionMetrics
    core: AdmissionCore
    shard_index: int  # the shard this service decides for (0 unsharded)
    dedupe_ttl_s: float
    _side: dict[str, RequestSide]
    _texts: dict[str, str]
    _done: deque[tuple[float, str]]
    _dirty_buckets: set[str]
    _op: int

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
        self, d: Decision, p: Pending | None, side: RequestSide | None, reply: dict[str, Any],
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
            if not stopped_running(d.outcome, d.gpu_id):
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

    def _violation(self, d: Decision, side: RequestSide | None) -> None:
        queued_for = side.queued_for if side else None
        if stopped_running(d.outcome, d.gpu_id):
            cause = "compute_saturation"  # it ran, and ran past its deadline
        elif queued_for in MEMORY_REASONS:
            cause = "memory_pressure"
        elif queued_for is not None or d.outcome is Outcome.TIMEOUT:
            cause = "queueing"
        else:
            cause = "compute_saturation"
        self.metrics.child(self.metrics.sla_violations, d.tenant, d.model, cause).inc()

    # --- kept-behind state and gauges -------------------------------------------------
    def _flush_buckets(self) -> None:
        for tenant in self._dirty_buckets:
            b = self.core.gate.bucket(tenant)
            self._op += 1
            self.store.put_bucket(tenant, BucketState(level=b.level, updated=b.updated),
                                  (self.outbox.seq, self._op))
            self.metrics.set_bucket(tenant, self.shard_index, b.level)
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
        self.metrics.observe_core(self.core, self.config.tenants_by_name, self.shard_index)
