"""What the core decides: one immutable record per decision, with its reasons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from triage.admission.record import Record
from triage.topics.reasons import Outcome, ReasonCode

# The outcomes by short names, Final so the compiled build reads them from C statics
# (a plain module global costs a dict lookup on every use); the dispatcher and the
# simulator compare every decision's outcome against these.
ACCEPT: Final = Outcome.ACCEPT
QUEUE: Final = Outcome.QUEUE
REJECT: Final = Outcome.REJECT
TIMEOUT: Final = Outcome.TIMEOUT
PREEMPT: Final = Outcome.PREEMPT
COMPLETE: Final = Outcome.COMPLETE

_DECISION_FIELDS = (
    "request_id",
    "tenant",
    "model",
    "pool",
    "outcome",
    "reason",
    "at",
    "attempt",
    "gpu_id",
    "predicted_s",
    "queue_wait_s",
    "retry_after_s",
    "policy",
    "policy_version",
    "request_tokens",
    "bucket_level",
    "bucket_burst",
    "bucket_debt_ceiling",
    "kv_bytes_needed",
    "kv_bytes_available",
    "variance_buffer",
    "sla_s",
    "slack_s",
    "queue_position",
    "queue_depth",
    "tenant_service",
    "overage",
    "utilization",
    "tightened",
    "recompute_tokens",
    "output_tokens",
    "latency_s",
    "detail",
)


class Decision(Record):
    """One decision about one request. Every field after `at` is an input that explains it.

    Immutable, with a NamedTuple's value semantics (triage.admission.record); the
    fields keep their order, so positional construction works as before."""

    __slots__ = _DECISION_FIELDS
    _fields: ClassVar[tuple[str, ...]] = _DECISION_FIELDS

    def __init__(
        self,
        request_id: str,
        tenant: str,
        model: str,
        pool: str | None,
        outcome: Outcome,
        reason: ReasonCode,
        at: float,
        attempt: int = 0,
        gpu_id: str | None = None,
        predicted_s: float | None = None,
        queue_wait_s: float | None = None,
        retry_after_s: float | None = None,
        policy: str = "",
        policy_version: str = "",
        request_tokens: float | None = None,
        bucket_level: float | None = None,
        bucket_burst: float | None = None,
        bucket_debt_ceiling: float | None = None,
        kv_bytes_needed: int | None = None,
        kv_bytes_available: int | None = None,
        variance_buffer: float | None = None,
        sla_s: float | None = None,
        slack_s: float | None = None,
        queue_position: int | None = None,
        queue_depth: int | None = None,
        tenant_service: float | None = None,
        overage: bool | None = None,
        utilization: float | None = None,
        tightened: bool | None = None,
        recompute_tokens: int | None = None,
        output_tokens: int | None = None,
        latency_s: float | None = None,
        detail: str | None = None,
    ) -> None:
        self.request_id: Final = request_id  # the request this decision is about
        self.tenant: Final = tenant  # its tenant
        self.model: Final = model  # its model
        self.pool: Final = pool  # the pool that serves the model (None if rejected at the gate)
        self.outcome: Final = outcome  # what happened
        self.reason: Final = reason  # why (closed enum)
        self.at: Final = at  # the core's `now` when decided, seconds
        self.attempt: Final = attempt  # dispatch attempt (bumps after a preemption)
        self.gpu_id: Final = gpu_id  # GPU dispatched to (accept) or preempted on
        self.predicted_s: Final = predicted_s  # buffered predicted execution time on that GPU
        self.queue_wait_s: Final = queue_wait_s  # time spent queued so far
        self.retry_after_s: Final = retry_after_s  # computed hint for rejects and timeouts
        self.policy: Final = policy  # name of the policy that decided
        self.policy_version: Final = policy_version  # its version
        # prompt + expected output charged to the bucket
        self.request_tokens: Final = request_tokens
        self.bucket_level: Final = bucket_level  # tokens in the bucket after the check (<0: debt)
        self.bucket_burst: Final = bucket_burst  # bucket capacity
        self.bucket_debt_ceiling: Final = bucket_debt_ceiling  # most the bucket may owe
        self.kv_bytes_needed: Final = kv_bytes_needed  # peak KV reservation the request needs
        self.kv_bytes_available: Final = kv_bytes_available  # most any eligible GPU could give it
        self.variance_buffer: Final = variance_buffer  # buffer applied to the prediction
        self.sla_s: Final = sla_s  # the request's SLA
        self.slack_s: Final = slack_s  # deadline - now when decided
        self.queue_position: Final = queue_position  # requests of the same tenant ahead of it
        self.queue_depth: Final = queue_depth  # pool queue depth when decided
        self.tenant_service: Final = tenant_service  # tenant's weighted service (fairness key)
        self.overage: Final = overage  # admitted over quota at reduced priority
        self.utilization: Final = utilization  # pool utilization seen by the hysteresis monitor
        self.tightened: Final = tightened  # the pool was above its high threshold
        self.recompute_tokens: Final = recompute_tokens  # tokens to prefill again (preemption)
        self.output_tokens: Final = output_tokens  # generated tokens (completion)
        self.latency_s: Final = latency_s  # arrival to completion (completion)
        self.detail: Final = detail  # free text for what the numbers do not say


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """A change of the hysteresis monitor's state, for the autoscale topic."""

    pool: str  # pool whose utilization moved
    at: float  # when
    autoscale: bool  # an autoscaler should add capacity
    tightened: bool  # admission is tightened
    utilization: float  # the reading that moved it
    gpus: int  # GPUs up in the pool
    reason: str  # plain words
