"""The core's view of one request while it is admitted, queued or running."""

from __future__ import annotations

from typing import Final

# Priority classes (lower is served first): within quota; over quota where the
# tenant's contract allows overage; over quota on idle capacity only (work conservation).
CLASS_QUOTA: Final = 0
CLASS_OVERAGE: Final = 1
CLASS_IDLE: Final = 2


class Pending:
    """Mutable per-request state owned by exactly one dispatcher (slots, hand-written init:
    this object is created on every decision)."""

    __slots__ = (
        "arrived",
        "attempt",
        "charged",
        "cls",
        "deadline",
        "dispatch_n",
        "dispatched_at",
        "enqueued_at",
        "expected_out",
        "expected_tokens",
        "expires_at",
        "gpu",
        "idle_s",
        "kv_bytes",
        "max_tokens",
        "model",
        "overage",
        "pool",
        "predicted_end",
        "predicted_raw_s",
        "predicted_s",
        "pressure",
        "prompt_tokens",
        "recompute_tokens",
        "request_id",
        "seq",
        "sla_s",
        "tenant",
        "timeout_reason",
        "true_out",
    )

    def __init__(
        self,
        request_id: str,
        tenant: str,
        model: str,
        pool: str,
        prompt_tokens: int,
        max_tokens: int,
        arrived: float,
        sla_s: float,
    ) -> None:
        self.request_id = request_id
        self.tenant = tenant
        self.model = model
        self.pool = pool
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.arrived = arrived
        self.sla_s = sla_s
        self.deadline = arrived + sla_s  # completion deadline (SLA)
        self.expected_out = float(max_tokens)  # learned used-output estimate, set by the gate
        self.expected_tokens = float(prompt_tokens + max_tokens)  # what the bucket is charged
        self.charged = 0.0  # tokens taken from the bucket and not yet settled (0: overage)
        self.true_out = -1.0  # clairvoyant reference only: the output it will generate
        self.kv_bytes = 0  # peak reservation, set by the dispatcher
        self.idle_s = 0.0  # predicted time on an idle GPU, buffered (queue drain, deadlines)
        self.cls = 0  # priority class: CLASS_QUOTA, CLASS_OVERAGE or CLASS_IDLE
        self.overage = False
        self.pressure = 0.0  # tenant's offered load / contracted rate at the gate
        self.attempt = 0  # bumps on re-dispatch after preemption or GPU loss
        self.seq = 0  # arrival order inside the dispatcher (FIFO tie-break)
        self.enqueued_at = -1.0  # last time it entered the queue (-1: never)
        self.expires_at = 0.0  # when it leaves the queue if still waiting
        self.timeout_reason = 0  # 0: queue_timeout, 1: deadline_unreachable
        self.gpu: object = None  # the GpuSlot it runs on
        self.dispatched_at = 0.0
        self.dispatch_n = 1.0  # sequences on its GPU counting itself, at dispatch
        self.predicted_raw_s = 0.0  # unbuffered prediction at dispatch (trains the buffer)
        self.predicted_s = 0.0  # buffered prediction at dispatch
        self.predicted_end = 0.0  # dispatched_at + predicted_s
        self.recompute_tokens = 0  # tokens prefilled again because of preemptions

    def __repr__(self) -> str:
        return f"Pending({self.request_id!r}, {self.tenant}, {self.model}, attempt={self.attempt})"
