"""The configuration of triage: one pydantic model, loaded from YAML.

Every knob has a default that works on a laptop; the example file in
``triage/examples/triage.yaml`` describes the seed's three tenants and two models.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from triage.config.security import KafkaSecurityConfig

Name = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9_-]*$")]
GpuId = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
ModelName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
PositiveFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]

GIB = 1024**3
# confluent-kafka's default message.max.bytes is 1,000,000: a request's derived records
# must stay under it. A live request's table record holds the request's bytes and, until
# their batch commits, the outputs it caused (its work item holds them again): twice the
# request plus < 32 KB.
MESSAGE_BYTES_CEILING = 470_000

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


class StrictModel(BaseModel):
    """Base for config models: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TenantConfig(StrictModel):
    """A tenant's contract: quota, queue, SLA, fairness weight and reserved share."""

    name: Name
    rate_tokens_per_s: PositiveFloat = Field(
        description="Refill rate of the token bucket, in LLM tokens (prompt + expected output)."
    )
    burst_tokens: PositiveFloat = Field(description="Bucket capacity: the largest burst.")
    max_debt_tokens: NonNegFloat = Field(
        0.0, description="Borrowing ceiling against future refill; 0 disables borrowing."
    )
    max_requests_per_s: PositiveFloat | None = Field(
        None, description="Request-rate limit beside the token quota (None: unlimited)."
    )
    max_concurrency: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Most requests of this tenant running at once (None: unlimited)."
    )
    allow_overage: bool = Field(
        False, description="Over quota: admit at reduced priority instead of refusing."
    )
    queue_max: Annotated[int, Field(ge=0)] = Field(200, description="Per-tenant queue bound.")
    max_queue_wait_ms: Annotated[int, Field(ge=0)] = Field(
        2000, description="A queued request leaves with timed_out after this wait."
    )
    sla_ms: Annotated[int, Field(ge=1)] = Field(
        10_000, description="Default end-to-end latency target (arrival to completion)."
    )
    weight: PositiveFloat = Field(1.0, description="Fair-share weight (contract value).")
    reserved_kv_share: Fraction = Field(
        0.0, description="Fraction of every GPU's KV budget that only this tenant may use."
    )
    output_ratio_prior: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        0.7, description="Initial guess of used/requested output tokens, until learned."
    )
    models: list[ModelName] | None = Field(
        None, description="Models the tenant may call (None: all)."
    )


class ModelConfig(StrictModel):
    """A served model: KV geometry, context, pool and per-GPU memory floor."""

    name: ModelName
    pool: Name = Field(description="The GPU pool that serves this model.")
    layers: Annotated[int, Field(ge=1, le=1024)]
    kv_heads: Annotated[int, Field(ge=1, le=1024)]
    head_dim: Annotated[int, Field(ge=1, le=4096)]
    dtype: Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"] = "bf16"
    context_tokens: Annotated[int, Field(ge=16, le=10_000_000)] = 8192
    reserved_kv_gib_per_gpu: NonNegFloat = Field(
        0.0, description="KV memory on each GPU of the pool that other models may not take."
    )
    prefill_s_per_token: PositiveFloat = Field(
        2.0e-5, description="Prior for prefill seconds per prompt token on a speed-1.0 GPU."
    )
    decode_s_per_token: PositiveFloat = Field(
        0.012, description="Prior for decode seconds per output token, one sequence, speed 1.0."
    )
    batch_slowdown: NonNegFloat = Field(
        0.02, description="Prior: relative decode slowdown per extra concurrent sequence."
    )

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head size x dtype bytes."""
        return int(2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype])


class GpuTypeConfig(StrictModel):
    """A kind of GPU: its memory and relative speed (1.0 = the models' priors)."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    memory_gib: PositiveFloat
    speed: PositiveFloat = 1.0


class PoolConfig(StrictModel):
    """A set of identical GPUs serving one or more models."""

    name: Name
    gpu_type: str
    gpus: list[GpuId] = Field(min_length=0)
    kv_budget_gib: PositiveFloat = Field(
        description="KV-cache memory per GPU after weights and activations: the ledger's budget."
    )
    queue_max: Annotated[int, Field(ge=0)] = Field(500, description="Pool-wide queue bound.")
    max_num_seqs: Annotated[int, Field(ge=1, le=65536)] = Field(
        256, description="Sequences each GPU's serving engine runs at once (vLLM "
        "--max-num-seqs): admission never dispatches more, so none waits inside the engine.",
    )
    partition: Annotated[int, Field(ge=0)] | None = Field(
        None, description="The admission partition (shard) that owns this pool, below "
        "kafka.admission_partitions; None: CRC-32 of the pool's name modulo the partitions. "
        "Every input of the pool is read, and its state kept, on this partition.",
    )


class HysteresisConfig(StrictModel):
    """Two thresholds on pool utilization; admission tightens first, autoscale follows."""

    low: Fraction = 0.65
    high: Fraction = 0.75
    autoscale_margin: Fraction = 0.05
    autoscale_after_s: PositiveFloat = 30.0
    relax_after_s: PositiveFloat = 30.0
    hold_s: PositiveFloat = 10.0
    smooth_s: NonNegFloat = Field(
        5.0, description="Time constant of the saturation reading's moving average: the "
        "thresholds see sustained saturation, not one large request's moment (0: raw).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.low < self.high:
            raise ValueError(
                f"hysteresis.low ({self.low}) must be below hysteresis.high ({self.high})"
            )
        return self


class PredictorConfig(StrictModel):
    """Online workload prediction and the variance buffer."""

    initial_variance_buffer: Annotated[float, Field(ge=1.0, le=10.0)] = 1.3
    # ceiling of the adaptive buffer: past it the fit is wrong, not noisy, and a higher
    # buffer refuses requests an idle GPU would serve in time (see docs/experiments.md)
    max_variance_buffer: Annotated[float, Field(ge=1.0, le=10.0)] = 1.3
    adaptive_buffer: bool = True
    target_miss_rate: Annotated[float, Field(gt=0.0, lt=0.5)] = 0.05
    residual_window: Annotated[int, Field(ge=10, le=100_000)] = 512
    min_samples: Annotated[int, Field(ge=1)] = 50
    learning_half_life: Annotated[int, Field(ge=1)] = 500


class PolicyPreset(StrEnum):
    """The named policies: the full triage policy and the baselines it is compared with."""

    FULL = "full"
    ADMIT_ALL = "admit_all"
    REJECT_ONLY = "reject_only"
    RATE_LIMIT_ONLY = "rate_limit_only"
    BOUNDED_QUEUE = "bounded_queue"
    # What users would pick instead of triage, as flags of the same core:
    VTC = "vtc"  # token-counter fair queuing (VTC), work-conserving, no refusals
    EDF = "edf"  # earliest SLO deadline first (llm-d flow control's slo-deadline)
    ENGINE_QUEUE_CAP = "engine_queue_cap"  # vLLM-style engine queue capped in tokens
    TPM_PRIORITY = "tpm_priority"  # LiteLLM-style TPM limit; over-quota uses idle capacity
    CLAIRVOYANT = "clairvoyant"  # full, told each request's true output and service time


class QueueOrder(StrEnum):
    """How the bounded queue orders waiting requests."""

    FAIR = "fair"  # lanes per tenant by weighted service (check 4), then deadline
    FIFO = "fifo"  # one lane by arrival
    DEADLINE = "deadline"  # one lane by SLA deadline (earliest first)


class PolicyConfig(StrictModel):
    """Which checks run. Presets set these; explicit fields override the preset."""

    name: str = "full"
    preset: PolicyPreset = PolicyPreset.FULL
    version: str = "1"
    quota: bool | None = None
    borrowing: bool | None = None
    memory_fit: bool | None = None
    sla_fit: bool | None = None
    queue: bool | None = None
    fairness: bool | None = None
    preemption: bool | None = None
    hysteresis: bool | None = None
    order: QueueOrder | None = Field(
        None, description="Queue order (fair, fifo, deadline); None: the preset's."
    )
    overage_when_idle: bool | None = Field(
        None, description="Work conservation: over-quota requests run at lower priority "
        "while the pool is not saturated, instead of being refused.",
    )
    pressure: bool | None = Field(
        None, description="Fairness counts a tenant's service inflated by its offered load "
        "over its quota (heavy senders lose priority).",
    )
    clairvoyant: bool | None = Field(
        None, description="Reference only (simulator): predict with each request's true "
        "output length and the true service model.",
    )
    cancel_late: bool | None = Field(
        None, description="A running request whose SLA deadline has passed is stopped while "
        "its pool is tightened (saturated) and answered `timeout` (deadline_unreachable): it "
        "has missed already, and its GPU time goes to requests that can still meet theirs. "
        "Off: late work runs to the end. None: the preset's (full: on; the baselines: off).",
    )
    engine_queue_ttft_s: PositiveFloat | None = Field(
        None, description="Baseline engine_queue_cap: each engine refuses new work once its "
        "queued prompt tokens exceed this target TTFT x its prefill rate.",
    )
    variance_buffer: Annotated[float, Field(ge=1.0, le=10.0)] | None = Field(
        None, description="Fixed buffer; None means the predictor's (adaptive) buffer."
    )
    preempt_sla_factor: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    tick_ms: Annotated[int, Field(ge=1, le=60_000)] = 50
    lookahead: Annotated[int, Field(ge=1, le=1000)] = Field(
        8, description="Tenants a dispatch pass may try past a blocked head before it stops."
    )
    lane_lookahead: Annotated[int, Field(ge=1, le=1000)] = Field(
        4, description="Requests of one tenant a dispatch pass may try past its own blocked "
        "head (no head-of-line blocking inside a tenant's lane).",
    )
    backfill_s: NonNegFloat = Field(
        0.5,
        description="How long smaller requests may start past a blocked queue head; after "
        "that the head holds its place (no starvation of large requests).",
    )
    hold_scope: Literal["gpu", "pool"] = Field(
        "gpu", description="What an aged, memory-blocked head holds: one GPU, the one "
        "predicted to free room for it first (others keep serving), or the whole pool.",
    )
    gpu_timeout_s: PositiveFloat = Field(
        10.0, description="A GPU whose heartbeats stop this long is taken out of the pool."
    )
    result_timeout_s: PositiveFloat = Field(
        600.0, description="A request running this long with no result, on a GPU whose "
        "heartbeats still arrive, is taken back and run again (a lost work item or a lost "
        "result must not leave it running for ever). The limit is never shorter than twice "
        "the predicted time of its whole max_tokens on a GPU running max_num_seqs.",
    )
    fair_share_tolerance: Annotated[float, Field(ge=0.0, le=10.0)] = Field(
        0.1, description="Tightened pools hold back tenants above (1 + this) x their fair share."
    )
    tight_sla_ratio: Annotated[float, Field(ge=0.0, le=100.0)] | None = Field(
        None, description="Tenants whose contracted SLA is within this x the pool's tightest "
        "are tight-SLA: a tightened pool holds them back only beyond tight_share_tolerance "
        "(the headroom the hold keeps is for tight-SLA work). 0: no such class. None: the "
        "preset's (full: 2.0; the baselines: 0).",
    )
    tight_share_tolerance: Annotated[float, Field(ge=0.0, le=10.0)] = Field(
        1.0, description="Tightened pools hold back tight-SLA tenants above (1 + this) x "
        "their fair share (others: fair_share_tolerance).",
    )
    deadline_s_per_token: Annotated[float, Field(ge=0.0, le=1.0)] | None = Field(
        None, description="Fair order with deadlines: a tenant's lane is keyed by its head's "
        "deadline plus this x its weighted service, so a tenant 1M weighted tokens ahead "
        "yields 1M x this seconds to tighter deadlines. 0: pure virtual-service order (VTC). "
        "None: the preset's (full: 3e-6; the baselines: 0).",
    )


class KafkaConfig(StrictModel):
    """Where the broker is and how topics are laid out."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: Name = "triage"
    request_partitions: Annotated[int, Field(ge=1)] = Field(
        1, description="Partitions of each tenant's request, reply and decision topics; "
        "equal to admission_partitions (requests are co-partitioned with their pool).")
    admission_partitions: Annotated[int, Field(ge=1)] = Field(
        1, description="Shards of the admission app: each pool lives on one partition "
        "(pools[*].partition), and the consumer group spreads partitions over instances.")
    tenant_topics: Literal["per_tenant", "shared"] = Field(
        "per_tenant", description="per_tenant: one request and one reply topic per tenant; "
        "a tenant's identity is its topic, so each tenant can hold its own Kafka principal "
        "(docs/security.md). shared: one request and one reply topic for every tenant, the "
        "tenant named in each request: for a trusted front door (the gateway) in front of "
        "many tenants, so the app's cost per request does not grow with the tenant count "
        "(docs/architecture.md, \"One topic pair for every tenant\").")
    replication_factor: Annotated[int, Field(ge=1)] = 1
    decisions_retention_ms: Annotated[int, Field(ge=-1)] = 30 * 24 * 3600 * 1000
    default_retention_ms: Annotated[int, Field(ge=-1)] = 7 * 24 * 3600 * 1000
    security: KafkaSecurityConfig = Field(
        default_factory=KafkaSecurityConfig,
        description="Authentication and TLS of every client (PLAINTEXT by default).",
    )


class MetricsConfig(StrictModel):
    """Prometheus ports; workers use worker_port_base + their index."""

    host: str = "127.0.0.1"
    admission_port: Annotated[int, Field(ge=0, le=65535)] = 9308
    worker_port_base: Annotated[int, Field(ge=0, le=65535)] = 9310


class AdmissionAppConfig(StrictModel):
    """The Faust admission app's own settings."""

    app_id: Name = "triage-admission"
    instance: Name = Field(
        "0", description="This process's name in the app's consumer group (static "
        "membership and its transactional outbox): one per running instance; an instance "
        "restarted under the same name takes its partitions back at once.")
    datadir: str = "var/admission"
    web_port: Annotated[int, Field(ge=1, le=65535)] = 6066
    dedupe_ttl_s: PositiveFloat = 3600.0
    static_membership: bool = Field(
        True, description="Join the consumer group with a fixed group.instance.id, so a "
        "restarted app gets its partitions back at once (docs/reliability.md, Failover).")
    session_timeout_s: Annotated[float, Field(ge=6.0, le=300.0)] = Field(
        10.0, description="Consumer-group session timeout: how long a dead app keeps its "
        "partitions when it does not come back.")
    max_message_bytes: Annotated[int, Field(ge=4096, le=MESSAGE_BYTES_CEILING)] = Field(
        460_000,
        description="Largest request message accepted, in bytes; larger ones are answered "
        "`invalid` (or dead-lettered). Every record the app derives from a request must "
        "fit the producers' 1 MB limit, and a table record carries the request and its "
        "work item until their batch commits, hence the ceiling.",
    )
    max_prompt_bytes: Annotated[int, Field(ge=1, le=MESSAGE_BYTES_CEILING)] = Field(
        400_000,
        description="Largest prompt accepted, in UTF-8 bytes (the prompt plus every chat "
        "message's content); a longer one is answered `invalid`. At most max_message_bytes.",
    )
    deadletter_value_bytes: Annotated[int, Field(ge=0, le=262_144)] = Field(
        65_536,
        description="How much of a refused message a dead letter keeps (the rest is cut; "
        "its size and SHA-256 are always recorded).",
    )

    @model_validator(mode="after")
    def _limits(self) -> Self:
        if self.max_prompt_bytes > self.max_message_bytes:
            raise ValueError(
                f"admission.max_prompt_bytes ({self.max_prompt_bytes}) must not exceed "
                f"admission.max_message_bytes ({self.max_message_bytes})"
            )
        return self


class WorkerConfig(StrictModel):
    """GPU worker settings."""

    heartbeat_s: PositiveFloat = 1.0
    sim_time_scale: PositiveFloat = Field(
        1.0, description="Sim backend: wall seconds per simulated second (<1 runs faster)."
    )
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_model_map: dict[str, str] = Field(default_factory=dict)
    openai_api_key_env: str = Field(
        "OPENAI_API_KEY",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the server's API key (vLLM --api-key); "
        "sent as a Bearer token when set. The key itself never goes in the config.",
    )
    openai_metrics_url: str | None = Field(
        None,
        description="The server's Prometheus endpoint (vLLM /metrics); None: the base URL "
        "without /v1, plus /metrics. Empty string: do not probe.",
    )
    openai_metrics_s: PositiveFloat = Field(
        1.0, description="How often the openai backend reads the server's /metrics."
    )
    completion_batch_max: Annotated[int, Field(ge=1, le=500)] = Field(
        10, description="Completions of one pool sent to the admission app in one message "
        "(a CompletionBatch), at most; 1 sends each alone (for an admission app older than "
        "the workers)."
    )
    completion_linger_ms: Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)] = Field(
        5.0, description="How long a finished attempt's completion waits for others to share "
        "its message: the latency one completion may gain, for fewer events per request."
    )
    stream_chunk_tokens: Annotated[int, Field(ge=1, le=4096)] = Field(
        16, description="Streaming: a chunk is published once it holds this many tokens..."
    )
    stream_chunk_ms: Annotated[int, Field(ge=1, le=10_000)] = Field(
        50, description="...or this long after its first token, whichever comes first."
    )


class GatewayConfig(StrictModel):
    """`triage gateway`: the OpenAI-compatible HTTP front door (docs/gateway.md)."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    keys_file: str | None = Field(
        None, description="YAML file of API keys, stored as SHA-256 digests, each mapped to "
        "a tenant (docs/gateway.md); relative paths are relative to the working directory."
    )
    keys_env: str = Field(
        "TRIAGE_GATEWAY_KEYS",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable with more keys, `tenant:key` pairs separated by "
        "commas (hashed at start, never stored).",
    )
    default_max_tokens: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        256, description="max_tokens of a request that sets none (admission needs a bound)."
    )
    reply_timeout_s: PositiveFloat | None = Field(
        None, description="How long a request waits for its terminal reply; None: the "
        "tenant's sla_ms + max_queue_wait_ms + 10 s."
    )
    timeout_retry_after_s: Annotated[int, Field(ge=0, le=3600)] = Field(
        1, description="Retry-After of a 408 (no terminal reply in time: there is no hint)."
    )


class TriageConfig(StrictModel):
    """Everything triage needs to run."""

    tenants: list[TenantConfig] = Field(min_length=1)
    models: list[ModelConfig] = Field(min_length=1)
    gpu_types: list[GpuTypeConfig] = Field(min_length=1)
    pools: list[PoolConfig] = Field(min_length=1)
    policy: PolicyConfig = PolicyConfig()
    hysteresis: HysteresisConfig = HysteresisConfig()
    predictor: PredictorConfig = PredictorConfig()
    kafka: KafkaConfig = KafkaConfig()
    metrics: MetricsConfig = MetricsConfig()
    admission: AdmissionAppConfig = AdmissionAppConfig()
    worker: WorkerConfig = WorkerConfig()
    gateway: GatewayConfig = GatewayConfig()

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        _unique("tenants", [t.name for t in self.tenants])
        _unique("models", [m.name for m in self.models])
        _unique("gpu_types", [g.name for g in self.gpu_types])
        _unique("pools", [p.name for p in self.pools])
        _unique("pools[*].gpus", [g for p in self.pools for g in p.gpus])
        pools = {p.name: p for p in self.pools}
        gpu_types = {g.name: g for g in self.gpu_types}
        models = {m.name for m in self.models}
        for i, p in enumerate(self.pools):
            if p.gpu_type not in gpu_types:
                raise ValueError(f"pools[{i}].gpu_type: unknown GPU type {p.gpu_type!r}")
            if p.kv_budget_gib > gpu_types[p.gpu_type].memory_gib:
                raise ValueError(
                    f"pools[{i}].kv_budget_gib: {p.kv_budget_gib} exceeds the "
                    f"{gpu_types[p.gpu_type].memory_gib} GiB of a {p.gpu_type}"
                )
        parts = self.kafka.admission_partitions
        for i, p in enumerate(self.pools):
            if p.partition is not None and p.partition >= parts:
                raise ValueError(
                    f"pools[{i}].partition: {p.partition} is not below "
                    f"kafka.admission_partitions ({parts})"
                )
        for i, m in enumerate(self.models):
            if m.pool not in pools:
                raise ValueError(f"models[{i}].pool: unknown pool {m.pool!r}")
        for p in self.pools:
            floors = sum(m.reserved_kv_gib_per_gpu for m in self.models if m.pool == p.name)
            if floors > p.kv_budget_gib:
                raise ValueError(
                    f"models[*].reserved_kv_gib_per_gpu: floors of pool {p.name!r} sum to "
                    f"{floors} GiB, above its kv_budget_gib {p.kv_budget_gib}"
                )
        shares = sum(t.reserved_kv_share for t in self.tenants)
        if shares > 0.9 + 1e-9:
            raise ValueError(f"tenants[*].reserved_kv_share: shares sum to {shares:.3f}, above 0.9")
        for i, t in enumerate(self.tenants):
            for name in t.models or []:
                if name not in models:
                    raise ValueError(f"tenants[{i}].models: unknown model {name!r}")
        return self

    # Lookups used on hot paths are built once (cached_property writes the instance dict,
    # which a frozen pydantic model allows).
    @cached_property
    def tenants_by_name(self) -> dict[str, TenantConfig]:
        return {t.name: t for t in self.tenants}

    @cached_property
    def models_by_name(self) -> dict[str, ModelConfig]:
        return {m.name: m for m in self.models}

    @cached_property
    def pools_by_name(self) -> dict[str, PoolConfig]:
        return {p.name: p for p in self.pools}

    @cached_property
    def gpu_types_by_name(self) -> dict[str, GpuTypeConfig]:
        return {g.name: g for g in self.gpu_types}

    @cached_property
    def pool_by_gpu(self) -> dict[str, PoolConfig]:
        return {g: p for p in self.pools for g in p.gpus}

    def tenant(self, name: str) -> TenantConfig | None:
        return self.tenants_by_name.get(name)

    def model(self, name: str) -> ModelConfig | None:
        return self.models_by_name.get(name)

    def pool(self, name: str) -> PoolConfig:
        return self.pools_by_name[name]

    def gpu_type(self, name: str) -> GpuTypeConfig:
        return self.gpu_types_by_name[name]

    def models_of_pool(self, pool: str) -> list[ModelConfig]:
        return [m for m in self.models if m.pool == pool]

    def pool_of_gpu(self, gpu_id: str) -> PoolConfig | None:
        return self.pool_by_gpu.get(gpu_id)

    def all_gpus(self) -> list[str]:
        return [g for p in self.pools for g in p.gpus]


def _unique(field: str, names: list[str]) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"{field}: duplicate name {n!r}")
        seen.add(n)

