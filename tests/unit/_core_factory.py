"""Small configurations for core tests (pure: no I/O)."""

from __future__ import annotations

from typing import Any

from triage.config.models import TriageConfig


def tenant(name: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name, "rate_tokens_per_s": 1e9, "burst_tokens": 1e9, "max_debt_tokens": 0,
        "queue_max": 50, "max_queue_wait_ms": 2000, "sla_ms": 60_000, "weight": 1.0,
    }
    base.update(kw)
    return base


def model(name: str = "m8", **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name, "pool": "p", "layers": 32, "kv_heads": 8, "head_dim": 128,
        "dtype": "bf16", "context_tokens": 32768, "prefill_s_per_token": 1e-5,
        "decode_s_per_token": 0.01, "batch_slowdown": 0.02,
    }
    base.update(kw)
    return base


def config(
    *, tenants: list[dict[str, Any]] | None = None, models: list[dict[str, Any]] | None = None,
    gpus: int = 2, kv_budget_gib: float = 1.0, queue_max: int = 100,
    policy: dict[str, Any] | None = None, hysteresis: dict[str, Any] | None = None,
    predictor: dict[str, Any] | None = None,
) -> TriageConfig:
    data: dict[str, Any] = {
        "tenants": tenants or [tenant("a"), tenant("b")],
        "models": models or [model()],
        "gpu_types": [{"name": "g", "memory_gib": 80, "speed": 1.0}],
        "pools": [{
            "name": "p", "gpu_type": "g", "gpus": [f"g{i}" for i in range(gpus)],
            "kv_budget_gib": kv_budget_gib, "queue_max": queue_max,
        }],
        "policy": policy or {"preset": "full"},
    }
    if hysteresis is not None:
        data["hysteresis"] = hysteresis
    if predictor is not None:
        data["predictor"] = predictor
    return TriageConfig.model_validate(data)


MIB = 1024 * 1024
BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # the default test model: 128 KiB per token
