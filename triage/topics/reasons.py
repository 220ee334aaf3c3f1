"""Closed enums shared by the core and the wire: reply statuses, outcomes, reason codes."""

from __future__ import annotations

from enum import StrEnum


class ReplyStatus(StrEnum):
    """What a tenant reads on its reply topic. Terminal statuses end a request."""

    ACCEPTED = "accepted"
    QUEUED = "queued"
    PREEMPTED = "preempted"
    STREAMING = "streaming"  # a chunk of generated tokens (the worker; stream=true only)
    COMPLETED = "completed"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    INVALID = "invalid"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        ReplyStatus.COMPLETED,
        ReplyStatus.REJECTED,
        ReplyStatus.TIMED_OUT,
        ReplyStatus.INVALID,
        ReplyStatus.FAILED,
    }
)
TERMINAL_STATUSES = _TERMINAL


class Outcome(StrEnum):
    """What a decision did to a request."""

    ACCEPT = "accept"  # dispatched to a GPU (at arrival or from the queue)
    QUEUE = "queue"  # waits in the bounded queue
    REJECT = "reject"  # refused, with a retry hint where one exists
    TIMEOUT = "timeout"  # left the queue without running
    PREEMPT = "preempt"  # a running request was stopped and requeued
    COMPLETE = "complete"  # the worker reported the end of execution
    INVALID = "invalid"  # the request parsed but cannot be served as written


class ReasonCode(StrEnum):
    """Why a decision went the way it did. Closed: every decision carries one of these."""

    # accept
    ADMITTED = "admitted"  # fit at arrival, dispatched at once
    DISPATCHED_FROM_QUEUE = "dispatched_from_queue"  # waited, then fit
    ADMITTED_OVERAGE = "admitted_overage"  # over quota, allowed at reduced priority
    # queue (or reject, when the policy has no queue)
    GPU_MEMORY_INSUFFICIENT = "gpu_memory_insufficient"  # no GPU has KV room for its peak
    RESERVATION_FLOOR = "reservation_floor"  # room exists but belongs to another model/tenant
    COMPUTE_SATURATION = "compute_saturation"  # fits, but predicted time misses the SLA
    QUEUED_BEHIND = "queued_behind"  # higher-priority requests are waiting first
    TENANT_CONCURRENCY = "tenant_concurrency"  # tenant at its concurrency limit
    TIGHTENED = "tightened"  # pool above its high threshold; over-share tenants wait
    # reject
    TENANT_QUOTA_EXCEEDED = "tenant_quota_exceeded"  # token bucket (with debt) too low
    TENANT_RATE_LIMITED = "tenant_rate_limited"  # request-rate limit
    QUOTA_NEVER_FITS = "quota_never_fits"  # cost above burst + debt ceiling: no wait helps
    QUEUE_FULL = "queue_full"  # the pool's queue is at its bound
    TENANT_QUEUE_FULL = "tenant_queue_full"  # the tenant's queue is at its bound
    SLA_INFEASIBLE = "sla_infeasible"  # even an idle GPU would miss the SLA
    NO_CAPACITY = "no_capacity"  # no GPU of the pool could ever hold it, or none is up
    # timeout
    QUEUE_TIMEOUT = "queue_timeout"  # waited its max queue time
    DEADLINE_UNREACHABLE = "deadline_unreachable"  # can no longer finish inside its SLA
    # preempt
    PREEMPTED_FOR_PRIORITY = "preempted_for_priority"  # made room for a tighter, higher one
    GPU_LOST = "gpu_lost"  # its GPU stopped reporting; requeued or failed
    RESULT_OVERDUE = "result_overdue"  # its GPU reports, but no result came: run again
    # complete
    COMPLETED = "completed"
    FAILED = "failed"
    # invalid
    INVALID_REQUEST = "invalid_request"  # fails the schema (detail says which field)
    UNKNOWN_TENANT = "unknown_tenant"
    TENANT_MISMATCH = "tenant_mismatch"  # payload tenant differs from the topic's tenant
    UNKNOWN_MODEL = "unknown_model"
    MODEL_NOT_ALLOWED = "model_not_allowed"  # tenant's contract excludes the model
    CONTEXT_OVERFLOW = "context_overflow"  # prompt + max_tokens beyond the model's context
    DUPLICATE = "duplicate"  # a redelivered request id; its first decision stands


_REPLY_STATUS = {
    Outcome.ACCEPT: ReplyStatus.ACCEPTED,
    Outcome.QUEUE: ReplyStatus.QUEUED,
    Outcome.REJECT: ReplyStatus.REJECTED,
    Outcome.TIMEOUT: ReplyStatus.TIMED_OUT,
    Outcome.PREEMPT: ReplyStatus.PREEMPTED,
    Outcome.INVALID: ReplyStatus.INVALID,
}


def reply_status(outcome: Outcome, reason: ReasonCode) -> ReplyStatus:
    """What a tenant is told a decision did: the one mapping from (outcome, reason) to a
    reply status (replies, replay's and the experiments' outcome words all use it)."""
    if outcome is Outcome.COMPLETE:
        return ReplyStatus.COMPLETED if reason is ReasonCode.COMPLETED else ReplyStatus.FAILED
    return _REPLY_STATUS[outcome]


def stopped_running(outcome: Outcome, gpu_id: str | None) -> bool:
    """Was this TIMEOUT a request stopped while it ran (past its deadline on a saturated
    pool: policy.cancel_late)? A TIMEOUT that names no GPU left the queue without running.
    The one place that tells them apart: the audit's sentence, the violation's cause, the
    worker's cancel and the simulator's stop all ask this."""
    return outcome is Outcome.TIMEOUT and bool(gpu_id)
