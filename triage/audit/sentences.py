"""One plain-words sentence per ReasonCode, naming the numbers behind the decision.

``SENTENCES`` maps every ReasonCode to a template (a test enforces that none is
missing, so adding a code without saying how to explain it fails CI). Each
template reads only the DecisionRecord; a number the policy did not record is
left out of the sentence rather than shown as a placeholder.
"""

from __future__ import annotations

from collections.abc import Callable

from triage.audit.units import count, human_bytes, millis, percent, seconds, tokens
from triage.topics.messages import DecisionInputs, DecisionRecord
from triage.topics.reasons import Outcome, ReasonCode, stopped_running

Template = Callable[[DecisionRecord], str]

OUTCOME_WORDS: dict[Outcome, str] = {
    Outcome.ACCEPT: "Accepted",
    Outcome.QUEUE: "Queued",
    Outcome.REJECT: "Rejected",
    Outcome.TIMEOUT: "Timed out",
    Outcome.PREEMPT: "Preempted",
    Outcome.COMPLETE: "Completed",
    Outcome.INVALID: "Invalid",
}


def _join(*parts: str | None, sep: str = "; ") -> str:
    return sep.join(p for p in parts if p)


def _paren(*parts: str | None) -> str:
    inner = _join(*parts)
    return f" ({inner})" if inner else ""


def _detail(r: DecisionRecord) -> str | None:
    return r.inputs.detail


# -- the numbers, phrased ----------------------------------------------------------------


def _bucket(i: DecisionInputs) -> str | None:
    """``its bucket held 310 tokens, burst 30,000, borrowing ceiling 30,000``."""
    if i.bucket_level is None:
        return None
    level = i.bucket_level
    held = (
        f"its bucket held {tokens(level)}"
        if level >= 0
        else f"its bucket was {tokens(-level)} in debt"
    )
    extra = ""
    if i.bucket_burst is not None:
        extra += f", burst {count(i.bucket_burst)}"
    if i.bucket_debt_ceiling is not None:
        extra += f", borrowing ceiling {count(i.bucket_debt_ceiling)}"
    return held + extra


def _drawable(i: DecisionInputs) -> float | None:
    """What the tenant could still take: its level plus what it may still borrow."""
    if i.bucket_level is None:
        return None
    return i.bucket_level + (i.bucket_debt_ceiling or 0.0)


def _asked(i: DecisionInputs) -> str | None:
    return f"it asked for {tokens(i.request_tokens)}" if i.request_tokens is not None else None


def _memory(i: DecisionInputs) -> str | None:
    """``it needs 2.0 GiB of KV cache at peak and the most any GPU could give was 1.1 GiB``."""
    need = i.kv_bytes_needed
    have = i.kv_bytes_available
    if need is None and have is None:
        return None
    if have is None:
        return f"it needs {human_bytes(need or 0)} of KV cache at peak"
    if need is None:
        return f"the most any GPU could give was {human_bytes(have)} of KV cache"
    return (
        f"it needs {human_bytes(need)} of KV cache at peak and the most any GPU could give "
        f"was {human_bytes(have)}"
    )


def _fit(i: DecisionInputs) -> str | None:
    """For admissions: ``its 1.0 GiB KV peak fit in 20.0 GiB free``."""
    if i.kv_bytes_needed is None:
        return None
    free = (
        f" in {human_bytes(i.kv_bytes_available)} free" if i.kv_bytes_available is not None else ""
    )
    return f"its {human_bytes(i.kv_bytes_needed)} KV peak fit{free}"


def _timing(i: DecisionInputs) -> str | None:
    """``predicted 5.2 s including a 1.30x variance buffer, against a 4.0 s SLA with 3.1 s of
    slack left``."""
    if i.predicted_s is None and i.sla_s is None:
        return None
    parts = []
    if i.predicted_s is not None:
        buf = f" including a {i.variance_buffer:.2f}x variance buffer," if i.variance_buffer else ""
        parts.append(f"predicted {seconds(i.predicted_s)}{buf}")
    if i.sla_s is not None:
        parts.append(f"against a {seconds(i.sla_s)} SLA")
    if i.slack_s is not None:
        parts.append(f"with {seconds(max(0.0, i.slack_s))} of slack left")
    return " ".join(parts)


def _queue(i: DecisionInputs) -> str | None:
    """``position 12 of 40 in the queue, 3 of them this tenant's``."""
    if i.queue_position is None and i.queue_depth is None:
        return None
    if i.queue_position is not None:
        where = f"position {count(i.queue_position)}"
        if i.queue_depth is not None:
            where += f" of {count(i.queue_depth)}"
        where += " in the queue"
    else:
        where = f"{count(i.queue_depth or 0)} waiting in the queue"
    if i.tenant_queue_depth is not None:
        where += f", {count(i.tenant_queue_depth)} of them this tenant's"
    return where


def _util(i: DecisionInputs) -> str | None:
    return f"pool utilization {percent(i.utilization)}" if i.utilization is not None else None


def _gpu(r: DecisionRecord) -> str:
    return f" on {r.gpu_id}" if r.gpu_id else ""


def _waited(r: DecisionRecord) -> str | None:
    return f"waited {millis(r.queue_wait_ms)} in the queue" if r.queue_wait_ms is not None else None


# -- templates, by reason ----------------------------------------------------------------


def _admitted(r: DecisionRecord) -> str:
    return f"dispatched at once{_gpu(r)}" + _paren(_fit(r.inputs), _timing(r.inputs))


def _from_queue(r: DecisionRecord) -> str:
    return f"dispatched{_gpu(r)} once it fit" + _paren(
        _waited(r), _fit(r.inputs), _timing(r.inputs)
    )


def _overage(r: DecisionRecord) -> str:
    return (
        f"tenant {r.tenant} was over quota but its contract allows overage, so it runs{_gpu(r)} "
        "at reduced priority" + _paren(_asked(r.inputs), _bucket(r.inputs))
    )


def _gpu_memory(r: DecisionRecord) -> str:
    return "no GPU had room for its KV cache" + _paren(_memory(r.inputs), _queue(r.inputs))


def _reservation(r: DecisionRecord) -> str:
    return "memory is free, but reserved for other models or tenants" + _paren(
        _memory(r.inputs), _queue(r.inputs), _detail(r)
    )


def _compute(r: DecisionRecord) -> str:
    return "it fits in memory, but the busy GPUs would miss its SLA" + _paren(
        _timing(r.inputs), _util(r.inputs), _queue(r.inputs)
    )


def _behind(r: DecisionRecord) -> str:
    service = (
        f"tenant {r.tenant} has been served {count(r.inputs.tenant_service)} weighted tokens"
        if r.inputs.tenant_service is not None
        else None
    )
    return "higher-priority requests are waiting first" + _paren(_queue(r.inputs), service)


def _concurrency(r: DecisionRecord) -> str:
    return f"tenant {r.tenant} is at its concurrency limit" + _paren(_detail(r), _queue(r.inputs))


def _tightened(r: DecisionRecord) -> str:
    return (
        "the pool is above its high utilization threshold, so tenants over their fair share wait"
        + _paren(_util(r.inputs), _queue(r.inputs))
    )


def _quota(r: DecisionRecord) -> str:
    i = r.inputs
    drawable = _drawable(i)
    what: str | None
    if i.request_tokens is not None and drawable is not None:
        what = (
            f"it asked for {tokens(i.request_tokens)} but could draw only "
            f"{tokens(max(0.0, drawable))}"
        )
    else:
        what = _asked(i)
    return f"tenant {r.tenant} was over quota" + (f": {what}" if what else "") + _paren(_bucket(i))


def _rate(r: DecisionRecord) -> str:
    return f"tenant {r.tenant} exceeded its request-rate limit" + _paren(_detail(r))


def _never_fits(r: DecisionRecord) -> str:
    i = r.inputs
    most = None
    if i.bucket_burst is not None:
        most = i.bucket_burst + (i.bucket_debt_ceiling or 0.0)
    limit = f", more than the {tokens(most)} its burst plus borrowing allow" if most else ""
    asked = f"it asks for {tokens(i.request_tokens)}" if i.request_tokens is not None else "it"
    return (
        f"{asked}{limit}; no wait will make it fit, so split the request or raise "
        f"tenant {r.tenant}'s contract"
    )


def _queue_full(r: DecisionRecord) -> str:
    return "the pool's queue is full" + _paren(_queue(r.inputs))


def _tenant_queue_full(r: DecisionRecord) -> str:
    i = r.inputs
    depth = (
        f"{count(i.tenant_queue_depth)} of its requests already waiting"
        if i.tenant_queue_depth is not None
        else None
    )
    return f"tenant {r.tenant}'s queue is full" + _paren(depth)


def _sla_infeasible(r: DecisionRecord) -> str:
    return (
        "even an idle GPU would miss its SLA" + _paren(_timing(r.inputs))
        + "; no wait helps: loosen sla_ms or ask for fewer tokens"
    )  # fmt: skip


def _no_capacity(r: DecisionRecord) -> str:
    pool = f" of pool {r.pool}" if r.pool else ""
    return f"no GPU{pool} could ever hold it, or none is up" + _paren(_memory(r.inputs))


def _queue_timeout(r: DecisionRecord) -> str:
    return "it reached its maximum queue wait before a GPU could take it" + _paren(
        _waited(r), _queue(r.inputs), _memory(r.inputs) if r.inputs.kv_bytes_available else None
    )


def _deadline(r: DecisionRecord) -> str:
    if stopped_running(r.outcome, r.gpu_id):
        return (f"it was still running{_gpu(r)} past its SLA deadline on a saturated pool, "
                "so it was stopped") + _paren(_timing(r.inputs))
    return "it could no longer finish inside its SLA" + _paren(_waited(r), _timing(r.inputs))


def _preempted(r: DecisionRecord) -> str:
    redo = (
        f"{tokens(r.inputs.recompute_tokens)} to prefill again"
        if r.inputs.recompute_tokens is not None
        else None
    )
    return (
        f"stopped{_gpu(r)} to make room for a tighter, higher-priority request, and requeued"
        + _paren(redo, _detail(r))
    )


def _taken_back(r: DecisionRecord, what: str) -> str:
    """A running request its GPU gave no result for: requeued, or ended (queue full)."""
    then = "so it was requeued" if r.outcome == Outcome.PREEMPT else "so it ended"
    gpu = f"its GPU {r.gpu_id}" if r.gpu_id else "its GPU"
    redo = (
        f"{tokens(r.inputs.recompute_tokens)} to prefill again"
        if r.inputs.recompute_tokens is not None
        else None
    )
    return f"{gpu} {what}, {then}" + _paren(redo, _detail(r))


def _gpu_lost(r: DecisionRecord) -> str:
    return _taken_back(r, "stopped reporting while it ran")


def _result_overdue(r: DecisionRecord) -> str:
    return _taken_back(r, "kept reporting but sent no result for it in time (the work item "
                          "or its result was lost)")


def _completed(r: DecisionRecord) -> str:
    predicted = f"predicted {seconds(r.predicted_s)}" if r.predicted_s is not None else None
    return f"ran to the end{_gpu(r)}" + _paren(_waited(r), predicted)


def _failed(r: DecisionRecord) -> str:
    return f"execution failed{_gpu(r)}" + _paren(_detail(r))


def _invalid(r: DecisionRecord) -> str:
    return "the request does not match the schema" + (f": {_detail(r)}" if _detail(r) else "")


def _unknown_tenant(r: DecisionRecord) -> str:
    return f"tenant {r.tenant} is not configured" + _paren(_detail(r))


def _mismatch(r: DecisionRecord) -> str:
    return (
        f"the payload names tenant {r.tenant}, but it was sent on another tenant's topic"
        + _paren(_detail(r))
    )


def _unknown_model(r: DecisionRecord) -> str:
    return f"model {r.model} is not served here" + _paren(_detail(r))


def _not_allowed(r: DecisionRecord) -> str:
    return f"tenant {r.tenant}'s contract does not include model {r.model}" + _paren(_detail(r))


def _context(r: DecisionRecord) -> str:
    asked = (
        f"{tokens(r.inputs.request_tokens)} requested"
        if r.inputs.request_tokens is not None
        else None
    )
    return f"prompt plus max_tokens exceed {r.model}'s context window" + _paren(asked, _detail(r))


def _duplicate(r: DecisionRecord) -> str:
    return "this request id was already seen, so its first decision stands" + _paren(_detail(r))


SENTENCES: dict[ReasonCode, Template] = {
    ReasonCode.ADMITTED: _admitted,
    ReasonCode.DISPATCHED_FROM_QUEUE: _from_queue,
    ReasonCode.ADMITTED_OVERAGE: _overage,
    ReasonCode.GPU_MEMORY_INSUFFICIENT: _gpu_memory,
    ReasonCode.RESERVATION_FLOOR: _reservation,
    ReasonCode.COMPUTE_SATURATION: _compute,
    ReasonCode.QUEUED_BEHIND: _behind,
    ReasonCode.TENANT_CONCURRENCY: _concurrency,
    ReasonCode.TIGHTENED: _tightened,
    ReasonCode.TENANT_QUOTA_EXCEEDED: _quota,
    ReasonCode.TENANT_RATE_LIMITED: _rate,
    ReasonCode.QUOTA_NEVER_FITS: _never_fits,
    ReasonCode.QUEUE_FULL: _queue_full,
    ReasonCode.TENANT_QUEUE_FULL: _tenant_queue_full,
    ReasonCode.SLA_INFEASIBLE: _sla_infeasible,
    ReasonCode.NO_CAPACITY: _no_capacity,
    ReasonCode.QUEUE_TIMEOUT: _queue_timeout,
    ReasonCode.DEADLINE_UNREACHABLE: _deadline,
    ReasonCode.PREEMPTED_FOR_PRIORITY: _preempted,
    ReasonCode.GPU_LOST: _gpu_lost,
    ReasonCode.RESULT_OVERDUE: _result_overdue,
    ReasonCode.COMPLETED: _completed,
    ReasonCode.FAILED: _failed,
    ReasonCode.INVALID_REQUEST: _invalid,
    ReasonCode.UNKNOWN_TENANT: _unknown_tenant,
    ReasonCode.TENANT_MISMATCH: _mismatch,
    ReasonCode.UNKNOWN_MODEL: _unknown_model,
    ReasonCode.MODEL_NOT_ALLOWED: _not_allowed,
    ReasonCode.CONTEXT_OVERFLOW: _context,
    ReasonCode.DUPLICATE: _duplicate,
}


def _unexplained(r: DecisionRecord) -> str:
    """Only for a reason code newer than this module: say the code, hide nothing."""
    return f"reason {r.reason.value}" + _paren(_detail(r))


def outcome_word(r: DecisionRecord) -> str:
    """The sentence's first word: a completion that failed reads as ``Failed``."""
    if r.reason == ReasonCode.FAILED:
        return "Failed"
    return OUTCOME_WORDS[r.outcome]


def sentence(r: DecisionRecord) -> str:
    """``Rejected: tenant rag was over quota: ...; retry in 1.2 s.``"""
    template = SENTENCES.get(r.reason, _unexplained)  # tests keep SENTENCES complete
    body = template(r)
    retry = f"; retry in {millis(r.retry_after_ms)}" if r.retry_after_ms is not None else ""
    return f"{outcome_word(r)}: {body}{retry}."
