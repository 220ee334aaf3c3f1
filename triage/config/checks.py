"""Checks past validation: a config that loads can still never work.

`runnable_problem` is the one place that says what the admission app cannot run
(today: more than one partition on its inputs); `topics create`, `triage admission`
and `config check` all ask it. `findings` lists the rest, one sentence each:
models that cannot hold even a small request, tenants whose quota can never pass a
request, tenants with nothing to call, processes that would bind one port. Pure:
no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from triage.config.models import GIB, ModelConfig, PoolConfig, TenantConfig, TriageConfig
from triage.topics.shards import pools_of_shard, shard_of_pool

# The cheapest request a tenant can send: 1 prompt token and at least 1 expected output
# token (the quota charges prompt + max(1, output ratio x max_tokens)).
SMALLEST_REQUEST_TOKENS = 2


class Severity(StrEnum):
    ERROR = "error"  # part of the config can never serve anything
    WARNING = "warning"  # some requests the config accepts can never be served


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    where: str  # a config path, like tenants[1:rag]
    message: str

    def line(self) -> str:
        return f"{self.severity.value}: {self.where}: {self.message}"


def runnable_problem(cfg: TriageConfig) -> str | None:
    """Why the admission app cannot run this config, or None. One place, so lifting a
    limit is one edit."""
    k = cfg.kafka
    if k.request_partitions != k.admission_partitions:
        return (
            f"kafka.request_partitions ({k.request_partitions}) must equal "
            f"kafka.admission_partitions ({k.admission_partitions}): partition n of every "
            "request topic belongs to the shard that owns the pools of partition n "
            "(docs/architecture.md, Partitioning the app)"
        )
    return None


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _kv_room(cfg: TriageConfig, model: ModelConfig, pool: PoolConfig) -> float:
    """KV bytes one GPU of the pool can give one request of `model`: the budget less the
    floors the pool's other models hold."""
    floors = sum(m.reserved_kv_gib_per_gpu for m in cfg.models_of_pool(pool.name)
                 if m.name != model.name)  # fmt: skip
    return (pool.kv_budget_gib - floors) * GIB


def _model_findings(cfg: TriageConfig) -> list[Finding]:
    out: list[Finding] = []
    for i, m in enumerate(cfg.models):
        where = f"models[{i}:{m.name}]"
        pool = cfg.pool(m.pool)
        if not pool.gpus:
            out.append(Finding(Severity.ERROR, where,
                               f"its pool {pool.name!r} has no GPUs: its requests can never run"))
            continue
        room = _kv_room(cfg, m, pool)
        per_token = m.kv_bytes_per_token
        if SMALLEST_REQUEST_TOKENS * per_token > room:
            out.append(Finding(Severity.ERROR, where,
                               f"not even a {SMALLEST_REQUEST_TOKENS}-token request fits the "
                               f"{_gib(room)} of KV a GPU of pool {pool.name!r} can give it"))
            continue
        full = m.context_tokens * per_token
        if full > room:
            fits = int(room // per_token)
            out.append(Finding(
                Severity.WARNING, where,
                f"a full-context request ({m.context_tokens:,} tokens) needs {_gib(full)} of "
                f"KV, above the {_gib(room)} a GPU of pool {pool.name!r} can give it: requests "
                f"over {fits:,} tokens (prompt + max_tokens) can never be admitted",
            ))
    return out


def _callable_models(cfg: TriageConfig, t: TenantConfig) -> list[ModelConfig]:
    names = t.models if t.models is not None else [m.name for m in cfg.models]
    return [m for n in names if (m := cfg.model(n)) is not None]


def _tenant_findings(cfg: TriageConfig) -> list[Finding]:
    out: list[Finding] = []
    borrowing = cfg.policy.borrowing is not False
    for i, t in enumerate(cfg.tenants):
        where = f"tenants[{i}:{t.name}]"
        models = _callable_models(cfg, t)
        served = [m for m in models if cfg.pool(m.pool).gpus]
        if not models:
            out.append(Finding(Severity.ERROR, where, "may call no model (models: [])"))
        elif not served:
            out.append(Finding(Severity.ERROR, where,
                               "every model it may call is in a pool without GPUs"))
        ceiling = t.burst_tokens + (t.max_debt_tokens if borrowing else 0.0)
        what = "burst_tokens + max_debt_tokens" if borrowing and t.max_debt_tokens else (
            "burst_tokens")
        if ceiling < SMALLEST_REQUEST_TOKENS:
            out.append(Finding(
                Severity.ERROR, where,
                f"{what} ({ceiling:g}) is below the smallest request "
                f"({SMALLEST_REQUEST_TOKENS} tokens): the quota refuses every request",
            ))
            continue
        largest = max((m.context_tokens for m in served), default=0)
        if largest > ceiling and not t.allow_overage:
            out.append(Finding(
                Severity.WARNING, where,
                f"requests costing over {what} ({ceiling:,.0f} tokens, prompt + expected "
                f"output) can never pass the quota, though its models accept up to "
                f"{largest:,} tokens",
            ))
        fastest = [m.prefill_s_per_token + m.decode_s_per_token for m in served]
        speed = max((cfg.gpu_type(cfg.pool(m.pool).gpu_type).speed for m in served),
                    default=1.0)  # fmt: skip
        if fastest and t.sla_ms / 1000 < min(fastest) / speed and cfg.policy.sla_fit is not False:
            out.append(Finding(
                Severity.ERROR, where,
                f"sla_ms ({t.sla_ms}) is below the predicted time of a 1-token request on its "
                f"fastest GPU ({1000 * min(fastest) / speed:.1f} ms): SLA fit refuses every "
                "request",
            ))
    return out


def _port_findings(cfg: TriageConfig) -> list[Finding]:
    m = cfg.metrics
    gpus = cfg.all_gpus()
    if not m.admission_port or not m.worker_port_base or not gpus:
        return []
    last = m.worker_port_base + len(gpus) - 1
    out: list[Finding] = []
    if m.worker_port_base <= m.admission_port <= last:
        gpu = gpus[m.admission_port - m.worker_port_base]
        out.append(Finding(Severity.ERROR, "metrics.admission_port",
                           f"{m.admission_port} is also the metrics port of GPU {gpu}'s worker "
                           f"(worker_port_base {m.worker_port_base} + its index)"))
    if last > 65535:
        out.append(Finding(Severity.ERROR, "metrics.worker_port_base",
                           f"{len(gpus)} workers from {m.worker_port_base} run past port 65535"))
    return out


def _shard_findings(cfg: TriageConfig) -> list[Finding]:
    """Shards that hold no pool: an instance assigned one of them decides nothing."""
    parts = cfg.kafka.admission_partitions
    if parts == 1:
        return []
    out: list[Finding] = []
    empty = [n for n in range(parts) if not pools_of_shard(cfg, n)]
    if empty:
        out.append(Finding(Severity.WARNING, "pools[*].partition",
                           f"shard(s) {', '.join(map(str, empty))} of {parts} hold no pool "
                           "(set pools[].partition to spread them): an instance given only "
                           "those decides nothing"))
    for i, t in enumerate(cfg.tenants):
        shards = sorted({shard_of_pool(cfg, m.pool) for m in _callable_models(cfg, t)})
        if len(shards) > 1:
            out.append(Finding(
                Severity.WARNING, f"tenants[{i}:{t.name}]",
                f"its models live on {len(shards)} shards ({', '.join(map(str, shards))}) and "
                "its quota applies on each: it may use up to "
                f"{len(shards)} x rate_tokens_per_s in all (restrict tenants[].models, or "
                "put its pools on one partition)"))
    return out


def findings(cfg: TriageConfig) -> list[Finding]:
    """Everything that makes (part of) a valid config unable to work, errors first."""
    out: list[Finding] = []
    problem = runnable_problem(cfg)
    if problem is not None:
        out.append(Finding(Severity.ERROR, "kafka", problem))
    out += (_model_findings(cfg) + _tenant_findings(cfg) + _port_findings(cfg)
            + _shard_findings(cfg))
    return sorted(out, key=lambda f: f.severity != Severity.ERROR)
