"""Translations between the core's objects and the wire's messages. Pure functions.

Outgoing messages on the hot path are written as JSON straight from the core's values:
no pydantic object is built (constructing one, even without validation, cost more than
the decision itself). The schemas stay the contract: tests parse every builder's output
with the validating models (tests/unit/test_codec.py)."""

from __future__ import annotations

import math
from typing import Any

import orjson

from triage.admission.decision import Decision, ScaleEvent
from triage.admission.pending import Pending
from triage.topics.messages import (
    ControlKind,
    ControlMessage,
    LiveRequest,
    LiveState,
    ScaleDirection,
    ScaleSignal,
)
from triage.topics.reasons import Outcome, reply_status, stopped_running


def ms(seconds: float) -> int:
    """Epoch seconds -> epoch milliseconds (wire time)."""
    return int(seconds * 1000.0)


def retry_ms(seconds: float | None) -> int | None:
    """A retry hint on the wire: whole milliseconds, rounded up so a client that waits
    exactly the hint is not early."""
    return None if seconds is None else max(0, math.ceil(seconds * 1000.0))


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _dumps(data: dict[str, Any]) -> bytes:
    """Compact JSON without the None fields (as Message.to_bytes writes it)."""
    return orjson.dumps({k: v for k, v in data.items() if v is not None})


def decision_record(d: Decision, arrival: Pending | None = None) -> bytes:
    """The audit log's line for a decision (a DecisionRecord, as JSON). Given the request
    that has just arrived, its decisions also record its shape (prompt and max tokens), so
    recorded traffic can be replayed from an export file alone (triage replay)."""
    shape = arrival if arrival is not None and arrival.request_id == d.request_id else None
    inputs = {
        "request_tokens": _num(d.request_tokens), "bucket_level": _num(d.bucket_level),
        "bucket_burst": _num(d.bucket_burst), "bucket_debt_ceiling": _num(d.bucket_debt_ceiling),
        "kv_bytes_needed": d.kv_bytes_needed, "kv_bytes_available": d.kv_bytes_available,
        "predicted_s": _num(d.predicted_s), "variance_buffer": _num(d.variance_buffer),
        "sla_s": _num(d.sla_s), "slack_s": _num(d.slack_s), "queue_position": d.queue_position,
        "queue_depth": d.queue_depth, "tenant_service": _num(d.tenant_service),
        "overage": d.overage, "utilization": _num(d.utilization), "tightened": d.tightened,
        "recompute_tokens": d.recompute_tokens, "detail": d.detail,
        "prompt_tokens": None if shape is None else shape.prompt_tokens,
        "max_tokens": None if shape is None else shape.max_tokens,
        "output_tokens": d.output_tokens,
    }
    return _dumps({
        "request_id": d.request_id, "tenant": d.tenant, "model": d.model, "pool": d.pool,
        "outcome": d.outcome.value, "reason": d.reason.value, "gpu_id": d.gpu_id,
        "predicted_s": _num(d.predicted_s),
        "queue_wait_ms": None if d.queue_wait_s is None else d.queue_wait_s * 1000.0,
        "retry_after_ms": retry_ms(d.retry_after_s), "policy": d.policy,
        "policy_version": d.policy_version, "at_ms": ms(d.at),
        "inputs": {k: v for k, v in inputs.items() if v is not None},
    })


def reply_for(d: Decision, *, text: str | None = None) -> dict[str, Any]:
    """What the tenant is told about a decision (a Reply, as a JSON-ready dict)."""
    status = reply_status(d.outcome, d.reason)
    if d.outcome is Outcome.COMPLETE:
        return {
            "request_id": d.request_id, "tenant": d.tenant, "status": status.value,
            "reason": d.reason.value, "detail": d.detail, "gpu_id": d.gpu_id,
            "latency_ms": None if d.latency_s is None else max(0.0, d.latency_s * 1000.0),
            "output_tokens": d.output_tokens, "text": text, "at_ms": ms(d.at),
        }
    return {
        "request_id": d.request_id, "tenant": d.tenant, "status": status.value,
        "reason": d.reason.value, "detail": d.detail, "retry_after_ms": retry_ms(d.retry_after_s),
        "gpu_id": d.gpu_id if d.outcome is Outcome.ACCEPT else None,
        "queue_position": d.queue_position if d.outcome is Outcome.QUEUE else None,
        "at_ms": ms(d.at),
        "bucket_level": _num(d.bucket_level),
        "bucket_burst": _num(d.bucket_burst),
    }


def reply_bytes(reply: dict[str, Any]) -> bytes:
    return _dumps(reply)


def work_item(
    d: Decision, p: Pending, *, prompt: str | None, metadata: dict[str, str],
    stream: bool = False, messages: list[dict[str, Any]] | None = None,
) -> tuple[str, bytes]:
    """What the GPU's worker runs for an ACCEPT decision: (gpu_id, WorkItem JSON)."""
    assert d.gpu_id is not None
    return d.gpu_id, _dumps({
        "request_id": p.request_id, "attempt": p.attempt, "tenant": p.tenant,
        "model": p.model, "pool": p.pool, "gpu_id": d.gpu_id,
        "prompt_tokens": p.prompt_tokens, "max_tokens": p.max_tokens, "prompt": prompt,
        "messages": messages, "reserved_kv_bytes": p.kv_bytes,
        "predicted_s": max(0.0, p.predicted_s),
        "dispatched_at_ms": ms(d.at), "deadline_ms": ms(p.deadline),
        "arrived_at_ms": ms(p.arrived), "metadata": metadata, "stream": stream or None,
    })


def control_for(d: Decision) -> ControlMessage | None:
    """Stop an attempt on its GPU: a preemption, a newer attempt made redundant, or a
    runner stopped past its deadline."""
    if d.gpu_id is None:
        return None
    if d.outcome is Outcome.PREEMPT:
        kind = ControlKind.PREEMPT
    elif stopped_running(d.outcome, d.gpu_id) or (  # or a newer attempt made this redundant
            d.outcome is Outcome.COMPLETE and d.detail and "cancelled" in d.detail):
        kind = ControlKind.CANCEL
    else:
        return None
    return ControlMessage(kind=kind, request_id=d.request_id, attempt=d.attempt,
                          gpu_id=d.gpu_id, reason=d.reason, at_ms=ms(d.at))


def scale_signal(e: ScaleEvent) -> ScaleSignal:
    return ScaleSignal(
        pool=e.pool, direction=ScaleDirection.UP if e.autoscale else ScaleDirection.STEADY,
        tightened=e.tightened, utilization=min(1.0, max(0.0, e.utilization)), gpus=e.gpus,
        reason=e.reason, at_ms=ms(e.at),
    )


def live_record(
    p: Pending, state: LiveState, *, prompt: str | None, metadata: dict[str, str],
    last_reply: dict[str, Any] | None, now: float, stream: bool = False,
    messages: list[dict[str, Any]] | None = None,
) -> bytes:
    """The table record of a live (or just finished) request (a LiveRequest, as JSON)."""
    gpu = p.gpu
    return _dumps({
        "request_id": p.request_id, "tenant": p.tenant, "model": p.model, "pool": p.pool,
        "state": state.value, "prompt_tokens": p.prompt_tokens, "max_tokens": p.max_tokens,
        "arrived": p.arrived, "sla_s": p.sla_s, "expected_out": p.expected_out,
        "expected_tokens": p.expected_tokens, "charged": p.charged,
        "priority_class": p.cls, "overage": p.overage,
        "pressure": p.pressure, "attempt": p.attempt, "recompute_tokens": p.recompute_tokens,
        "enqueued_at": p.enqueued_at, "expires_at": p.expires_at,
        "timeout_reason": p.timeout_reason, "idle_s": p.idle_s,
        "dispatched_at": p.dispatched_at, "predicted_raw_s": p.predicted_raw_s,
        "predicted_s": p.predicted_s, "gpu_id": getattr(gpu, "gpu_id", None) if gpu else None,
        "prompt": prompt, "messages": messages, "metadata": metadata,
        "stream": stream or None, "last_reply": None if last_reply is None else
        {k: v for k, v in last_reply.items() if v is not None},
        "updated": now,
    })


def finished_record(raw: bytes, last_reply: dict[str, Any], now: float) -> bytes:
    """A stored record turned into its dedupe form: done, with the last reply, no prompt."""
    data = orjson.loads(raw)
    data.update(state=LiveState.DONE.value, prompt=None, updated=now,
                last_reply={k: v for k, v in last_reply.items() if v is not None})
    return _dumps(data)


NO_POOL = "none"  # the pool of a request answered at the gate (it never reached one)


def answered_record(
    request_id: str, tenant: str, model: str, last_reply: dict[str, Any], now: float
) -> bytes:
    """The done record of a request answered without the core (`invalid`): it holds the
    request id, so a redelivery or another body under it gets no second terminal reply."""
    return _dumps({
        "request_id": request_id, "tenant": tenant, "model": model, "pool": NO_POOL,
        "state": LiveState.DONE.value, "prompt_tokens": 1, "max_tokens": 1, "arrived": now,
        "sla_s": 0.0, "expected_out": 0.0, "expected_tokens": 0.0,
        "last_reply": {k: v for k, v in last_reply.items() if v is not None}, "updated": now,
    })


def pending_from(rec: LiveRequest) -> Pending:
    """Rebuild the core's object from a table record."""
    p = Pending(rec.request_id, rec.tenant, rec.model, rec.pool, rec.prompt_tokens,
                rec.max_tokens, rec.arrived, rec.sla_s)
    p.expected_out = rec.expected_out
    p.expected_tokens = rec.expected_tokens
    p.charged = rec.charged
    p.cls = rec.priority_class
    p.overage = rec.overage
    p.pressure = rec.pressure
    p.attempt = rec.attempt
    p.recompute_tokens = rec.recompute_tokens
    p.enqueued_at = rec.enqueued_at
    p.expires_at = rec.expires_at
    p.timeout_reason = rec.timeout_reason
    p.idle_s = rec.idle_s
    p.dispatched_at = rec.dispatched_at
    p.predicted_raw_s = rec.predicted_raw_s
    p.predicted_s = rec.predicted_s
    p.predicted_end = rec.dispatched_at + rec.predicted_s
    return p
