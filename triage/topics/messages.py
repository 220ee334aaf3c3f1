"""Pydantic v2 models for every message on triage's topics.

Times on the wire are integer milliseconds since the epoch (``*_ms``); durations
in seconds are floats (``*_s``). Models are strict: a float where an int belongs,
a NaN, an empty id or an absurd token count is refused with the field's name.
"""

from __future__ import annotations

import base64
import hashlib
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from triage.topics.jsonsafe import is_unicode, safe_text
from triage.topics.reasons import Outcome, ReasonCode, ReplyStatus

MAX_TOKENS = 10_000_000  # more than any context window in service: larger is a bug upstream
MAX_SLA_MS = 24 * 3600 * 1000
DEADLETTER_KEEP_BYTES = 65_536  # admission.deadletter_value_bytes's default

RequestId = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$")
]
TenantName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
ModelName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
GpuId = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
PoolName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS, strict=True)]
PositiveTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS, strict=True)]
EpochMs = Annotated[int, Field(ge=0, strict=True)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


# The wire schema's version (docs/schema.md). Bump it when a message gains a field;
# a message that says a newer version than this build knows is refused by name.
SCHEMA_VERSION = 1
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_id(name: str, version: int = SCHEMA_VERSION) -> str:
    """The `$id` of a message's JSON Schema document: a URN, so nothing must be hosted."""
    return f"urn:triage:schema:{name}:v{version}"


class Message(BaseModel):
    """Base of every message: unknown fields are errors, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSION, strict=True)] | None = Field(
        None,
        description="Wire schema version the producer wrote (absent: 1). A version newer "
        f"than this build's ({SCHEMA_VERSION}) is refused, not half-read.",
    )

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Self:
        return cls.model_validate_json(data)


class ChatMessage(Message):
    """One turn of a chat prompt (OpenAI's chat format, text content only). Strict, and
    its text valid Unicode, as the request that carries it."""

    model_config = ConfigDict(strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str = Field(max_length=4_000_000)
    name: str | None = Field(None, max_length=64)

    @field_validator("content", "name")
    @classmethod
    def _is_text(cls, v: str | None) -> str | None:
        if v is not None and not is_unicode(v):
            raise ValueError("holds a lone UTF-16 surrogate, which is not a character")
        return v


class InferenceRequest(Message):
    """What a tenant asks for: a completion of at most max_tokens after a prompt. Strict
    in every field (the one message written by outsiders): `"stream": "yes"` or
    `"prompt_tokens": 1.0` is refused, not coerced; text must be valid Unicode."""

    model_config = ConfigDict(strict=True)

    request_id: RequestId
    tenant: TenantName
    model: ModelName
    prompt_tokens: PositiveTokens
    max_tokens: PositiveTokens
    sla_ms: Annotated[int, Field(ge=1, le=MAX_SLA_MS, strict=True)] | None = Field(
        None, description="End-to-end latency target; None takes the tenant's default."
    )
    created_at_ms: EpochMs | None = Field(None, description="Client send time.")
    prompt: str | None = Field(None, max_length=4_000_000, description="Text, for real backends.")
    messages: list[ChatMessage] | None = Field(
        None, max_length=1024, description="A chat prompt (real backends call the chat "
        "endpoint with it); prompt_tokens still counts its tokens."
    )
    stream: bool = Field(
        False,
        description="Stream generated tokens back as non-terminal `streaming` replies "
        "(opt-in, as in the OpenAI API: every chunk is a message on the reply topic).",
    )
    attempt: Annotated[int, Field(ge=0, le=1000, strict=True)] = 0
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)

    @field_validator("prompt")
    @classmethod
    def _prompt_is_text(cls, v: str | None) -> str | None:
        if v is not None and not is_unicode(v):
            raise ValueError("holds a lone UTF-16 surrogate, which is not a character")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata_is_text(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():
            if not (is_unicode(k) and is_unicode(x)):
                raise ValueError("holds a lone UTF-16 surrogate, which is not a character")
        return v

    @model_validator(mode="after")
    def _sane_total(self) -> Self:
        if self.prompt_tokens + self.max_tokens > MAX_TOKENS:
            raise ValueError(
                f"prompt_tokens + max_tokens = {self.prompt_tokens + self.max_tokens} "
                f"exceeds {MAX_TOKENS}"
            )
        return self


class AdmittedRequest(Message):
    """Gate -> dispatcher: a request that passed the tenant quota (internal topic)."""

    request: InferenceRequest
    pool: PoolName
    arrived_at_ms: EpochMs
    deadline_ms: EpochMs
    expected_tokens: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    overage: bool = False
    quota_pressure: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    bucket_level: float = Field(0.0, allow_inf_nan=False)


class Reply(Message):
    """What the tenant reads on its reply topic about one request."""

    request_id: RequestId
    tenant: TenantName
    status: ReplyStatus
    reason: ReasonCode | None = None
    detail: str | None = Field(None, max_length=2000)
    retry_after_ms: Annotated[int, Field(ge=0, strict=True)] | None = None
    gpu_id: GpuId | None = None
    queue_position: Annotated[int, Field(ge=0)] | None = None
    latency_ms: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    output_tokens: TokenCount | None = None
    text: str | None = None
    at_ms: EpochMs
    # The tenant's token bucket at the decision (rejections, accepts and queueings at
    # arrival): what an HTTP front door turns into x-ratelimit-* headers.
    bucket_level: float | None = Field(None, allow_inf_nan=False,
                                       description="Tokens left (negative: debt).")
    bucket_burst: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    # `streaming` replies only (from the worker): the next pieces of generated text.
    tokens: list[str] | None = Field(
        None, max_length=4096, description="Generated text, one piece per token, starting "
        "at token index `token_offset` of the attempt."
    )
    token_offset: TokenCount | None = None
    attempt: Annotated[int, Field(ge=0, strict=True)] | None = None
    first_token_at_ms: EpochMs | None = Field(
        None, description="When the worker saw the attempt's first token (time to first "
        "token = this minus the request's created_at_ms)."
    )

    @property
    def terminal(self) -> bool:
        return self.status.terminal


class DecisionInputs(Message):
    """The numbers behind a decision, enough to explain it to a customer."""

    request_tokens: float | None = None  # prompt + expected output, charged to the bucket
    bucket_level: float | None = None  # tokens (negative: debt) after the check
    bucket_burst: float | None = None
    bucket_debt_ceiling: float | None = None
    kv_bytes_needed: int | None = None  # peak reservation: (prompt + max_tokens) x bytes/token
    kv_bytes_available: int | None = None  # the most any GPU could give this request
    predicted_s: float | None = None  # buffered predicted execution time
    variance_buffer: float | None = None
    sla_s: float | None = None
    slack_s: float | None = None  # deadline - now at the decision
    queue_position: int | None = None
    queue_depth: int | None = None
    tenant_queue_depth: int | None = None
    tenant_service: float | None = None  # weighted served tokens (fairness key)
    overage: bool | None = None
    utilization: float | None = None
    tightened: bool | None = None
    recompute_tokens: int | None = None  # tokens to prefill again after preemption
    detail: str | None = None
    # The request's shape, on the decision made at its arrival, and what a completion
    # generated: enough for `triage replay --from-file` to rebuild the traffic offline.
    prompt_tokens: TokenCount | None = None
    max_tokens: TokenCount | None = None
    output_tokens: TokenCount | None = None  # generated tokens (complete)


class DecisionRecord(Message):
    """One line of the audit log (topic triage.decisions, keyed by request_id)."""

    request_id: RequestId
    tenant: TenantName
    model: ModelName
    pool: PoolName | None = None
    outcome: Outcome
    reason: ReasonCode
    gpu_id: GpuId | None = None
    predicted_s: float | None = None
    queue_wait_ms: float | None = None
    retry_after_ms: int | None = None
    policy: str
    policy_version: str
    at_ms: EpochMs
    inputs: DecisionInputs = DecisionInputs()


class WorkItem(Message):
    """Dispatcher -> worker: run this request on this GPU (topic triage.gpu.<id>.work)."""

    request_id: RequestId
    attempt: Annotated[int, Field(ge=0, strict=True)] = 0  # bumps on each re-dispatch
    tenant: TenantName
    model: ModelName
    pool: PoolName
    gpu_id: GpuId
    prompt_tokens: PositiveTokens
    max_tokens: PositiveTokens
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    reserved_kv_bytes: Annotated[int, Field(ge=0)]
    predicted_s: Seconds
    dispatched_at_ms: EpochMs
    deadline_ms: EpochMs
    arrived_at_ms: EpochMs
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)  # from the request
    stream: bool = False  # publish token chunks to the tenant's reply topic (from the request)

    @property
    def work_id(self) -> str:
        return f"{self.request_id}#{self.attempt}"


class CompletionStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"


class Completion(Message):
    """Worker -> dispatcher: a work item ended (topic triage.completions, keyed by pool)."""

    request_id: RequestId
    attempt: Annotated[int, Field(ge=0, strict=True)] = 0
    tenant: TenantName
    model: ModelName
    pool: PoolName
    gpu_id: GpuId
    gpu_type: str
    status: CompletionStatus
    prompt_tokens: TokenCount
    output_tokens: TokenCount
    max_tokens: PositiveTokens
    prefill_s: Seconds = Field(description="Prefill time: the engine started the attempt "
                               "to its first token (engine queueing excluded).")
    decode_s: Seconds
    queue_s: Seconds = Field(0.0, description="Time the attempt waited inside the serving "
                             "engine's own queue before it started.")
    mean_concurrency: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 1.0
    started_at_ms: EpochMs
    finished_at_ms: EpochMs
    error: str | None = None
    text: str | None = Field(None, description="Generated text (real backends); forwarded "
                             "to the tenant in the terminal reply by the dispatcher.")


MAX_COMPLETION_BATCH = 500
_BATCH_MARK = b'"completions"'


class CompletionBatch(Message):
    """Worker -> dispatcher: several completions of one pool in one message, so the
    admission app pays its per-event cost once for all of them (docs/architecture.md)."""

    completions: list[Completion] = Field(min_length=1, max_length=MAX_COMPLETION_BATCH)

    @model_validator(mode="after")
    def _one_pool(self) -> Self:
        pools = {c.pool for c in self.completions}
        if len(pools) > 1:
            raise ValueError(f"a batch holds one pool's completions (its key); got {sorted(pools)}")
        return self


def completions_in(data: bytes | str) -> list[Completion]:
    """What one message on triage.completions carries: a Completion, or a CompletionBatch.
    Raises ValueError (pydantic's, naming the field) for anything else."""
    raw = data.encode() if isinstance(data, str) else data
    if _BATCH_MARK not in raw:
        return [Completion.from_bytes(raw)]
    try:
        return list(CompletionBatch.from_bytes(raw).completions)
    except ValueError as batch_error:  # a lone completion whose text says "completions"
        try:
            return [Completion.from_bytes(raw)]
        except ValueError:
            raise batch_error from None


class GpuState(StrEnum):
    UP = "up"
    DRAINING = "draining"
    DOWN = "down"


class GpuStatus(Message):
    """Worker heartbeat (compacted topic triage.gpu.status, keyed by gpu_id)."""

    gpu_id: GpuId
    pool: PoolName
    gpu_type: str
    name: str
    state: GpuState = GpuState.UP
    simulated: bool
    memory_total_bytes: Annotated[int, Field(ge=0)]
    memory_used_bytes: Annotated[int, Field(ge=0)] | None = None
    kv_budget_bytes: Annotated[int, Field(ge=0)]
    utilization: Ratio  # compute utilization (NVML, or the sim's busy fraction)
    running: Annotated[int, Field(ge=0)] = 0
    # The serving engine's own view, where the backend can read it (vLLM's /metrics, the
    # sim's model); None when unknown. Saturation signals, unlike NVML's utilization.
    running_seqs: Annotated[int, Field(ge=0)] | None = None  # vllm:num_requests_running
    waiting_seqs: Annotated[int, Field(ge=0)] | None = None  # vllm:num_requests_waiting
    kv_usage: Ratio | None = None  # vllm:kv_cache_usage_perc (0..1); sim: KV used / budget
    healthy: bool = True
    ecc_errors: Annotated[int, Field(ge=0)] | None = None
    temperature_c: float | None = None
    driver: str | None = None
    at_ms: EpochMs


class ControlKind(StrEnum):
    PREEMPT = "preempt"
    CANCEL = "cancel"


class ControlMessage(Message):
    """Dispatcher -> worker: stop a running attempt (topic triage.gpu.<id>.control)."""

    kind: ControlKind
    request_id: RequestId
    attempt: Annotated[int, Field(ge=0, strict=True)]
    gpu_id: GpuId
    reason: ReasonCode
    at_ms: EpochMs


class ScaleDirection(StrEnum):
    UP = "up"
    STEADY = "steady"


class ScaleSignal(Message):
    """Hysteresis monitor -> external autoscaler (topic triage.autoscale, keyed by pool)."""

    pool: PoolName
    direction: ScaleDirection
    tightened: bool
    utilization: Ratio
    gpus: Annotated[int, Field(ge=0)]
    reason: str
    at_ms: EpochMs


DeadLetterStage = Literal["gate", "dispatcher", "worker", "completions", "status"]


class DeadLetter(Message):
    """Input that could not be used, kept with the reason (topic triage.deadletter). The
    value is cut to a bound (`value_b64` holds its first bytes) so a dead letter always
    fits the producer; its full size and SHA-256 identify the original."""

    source_topic: str
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    value_b64: str
    value_bytes: Annotated[int, Field(ge=0)] | None = None  # size of the original value
    value_sha256: str | None = None  # hex digest of the original value
    truncated: bool = False  # value_b64 holds only the first bytes
    error: str
    stage: DeadLetterStage = "gate"
    at_ms: EpochMs

    @classmethod
    def of(
        cls, *, source_topic: str, partition: int | None, offset: int | None,
        key: bytes | None, value: bytes | None, error: str, stage: DeadLetterStage,
        at_ms: int, keep_bytes: int = DEADLETTER_KEEP_BYTES,
    ) -> DeadLetter:
        """A dead letter of bounded size for any input (however large or odd)."""
        raw = value or b""
        return cls(
            source_topic=source_topic, partition=partition, offset=offset,
            key=None if not key else safe_text(key.decode(errors="replace"), 256),
            value_b64=base64.b64encode(raw[:keep_bytes]).decode(), value_bytes=len(raw),
            value_sha256=hashlib.sha256(raw).hexdigest(), truncated=len(raw) > keep_bytes,
            error=safe_text(error, 4000), stage=stage, at_ms=at_ms,
        )


class InvalidVerdict(Message):
    """An invalid request too large to forward (sharding): the shard it landed on kept
    the bytes as a dead letter and sends the verdict on to the shard of its model, which
    knows whether the id is fresh and answers (topic: the request's own, header
    `triage-verdict`)."""

    request_id: RequestId
    model: ModelName | None = None
    reason: ReasonCode
    detail: str = Field(max_length=4000)


class Tick(Message):
    """The admission app's clock tick (topic triage.admission). Ticks travel through Kafka
    so the dispatcher handles them as events, in order with everything else, and may
    write its RocksDB tables (which Faust allows only inside an event)."""

    kind: Literal["tick"] = "tick"
    at_ms: EpochMs


class Route(Message):
    """Where requests for one model go (the routes topic, key: the model's name): the
    request-topic partition of the shard that owns its pool. The admission app writes
    one per configured model at start; a client without the config reads them so that
    its requests reach their shard directly instead of being forwarded (one hop less)."""

    model: str = Field(min_length=1, max_length=256)
    partition: Annotated[int, Field(ge=0, strict=True)]
    partitions: Annotated[int, Field(ge=1, strict=True)]  # the app's admission_partitions

    @model_validator(mode="after")
    def _inside(self) -> Self:
        if self.partition >= self.partitions:
            raise ValueError(f"partition {self.partition} of {self.partitions}")
        return self


class OutboxMark(Message):
    """The admission app's commit marker (its marks topic, key `mark`): written in the
    same Kafka transaction as output batch `seq`, so a committed marker says that batch
    and every one before it reached the wire (recovery re-sends only later batches)."""

    seq: Annotated[int, Field(ge=0, strict=True)]
    # the transactional id that wrote it: a process taking the shard over fences it when
    # it left a transaction open (killed), so readers do not wait out its timeout
    writer: str | None = Field(None, max_length=512)
    # the writer's lanes (streams/lanes.py): 2 when its replies go on a reply lane with
    # marks of their own; 1 (every mark before 2026-12-06) when this batch held them too
    lanes: Literal[1, 2] = 1


class LiveState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class LiveRequest(Message):
    """The admission app's record of one request (table `requests`, keyed by request_id):
    enough to rebuild the core's queue and ledger after a restart, and to answer a
    redelivered request with its recorded reply. Times are epoch seconds (floats, exact)."""

    request_id: RequestId
    tenant: TenantName
    model: ModelName
    pool: PoolName
    state: LiveState
    prompt_tokens: PositiveTokens
    max_tokens: PositiveTokens
    arrived: float
    sla_s: float
    expected_out: float
    expected_tokens: float
    charged: float = 0.0  # tokens taken from the bucket, settled when it leaves
    priority_class: int = 0  # 0 within quota, 1 contracted overage, 2 idle-capacity overage
    overage: bool = False
    pressure: float = 0.0
    attempt: int = 0
    recompute_tokens: int = 0
    enqueued_at: float = -1.0
    expires_at: float = 0.0
    timeout_reason: int = 0
    idle_s: float = 0.0
    dispatched_at: float = 0.0
    predicted_raw_s: float = 0.0
    predicted_s: float = 0.0
    gpu_id: GpuId | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    stream: bool = False
    last_reply: Reply | None = None  # what the tenant was last told (resent on redelivery)
    updated: float = 0.0


class BucketState(Message):
    """A tenant's token bucket (table `buckets`, keyed by tenant)."""

    level: float
    updated: float


ALL_MESSAGES: dict[str, type[Message]] = {
    m.__name__: m
    for m in (
        InferenceRequest,
        AdmittedRequest,
        Reply,
        DecisionRecord,
        WorkItem,
        Completion,
        CompletionBatch,
        GpuStatus,
        ControlMessage,
        ScaleSignal,
        DeadLetter,
        LiveRequest,
        BucketState,
        Tick,
        OutboxMark,
        Route,
    )
}


def json_schema_document(name: str) -> dict[str, Any]:
    """One message's JSON Schema as a document a schema registry can take on its own:
    `$schema` (draft 2020-12, what pydantic writes), `$id` (name and version) and its
    `$defs` inside."""
    body = ALL_MESSAGES[name].model_json_schema()
    return {"$schema": JSON_SCHEMA_DIALECT, "$id": schema_id(name), **body}


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema document of every message, for producers written in other languages."""
    return {name: json_schema_document(name) for name in ALL_MESSAGES}
