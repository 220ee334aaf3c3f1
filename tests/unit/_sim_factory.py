"""Small simulator inputs for the sim tests (pure: no I/O)."""

from __future__ import annotations

from typing import Any

from tests.unit._core_factory import config, model, tenant
from triage.config.models import TriageConfig
from triage.sim.arrivals import OnOff, Poisson
from triage.sim.dists import Const, LogNormal
from triage.sim.scenario import Scenario
from triage.sim.workload import Workload


def sim_config(*, gpus: int = 2, kv_budget_gib: float = 1.0, **kw: Any) -> TriageConfig:
    """Two tenants (a tight-SLA one and a loose one) on a small KV budget."""
    return config(
        tenants=[
            tenant("a", sla_ms=4000, max_queue_wait_ms=1000, weight=2.0,
                   rate_tokens_per_s=40_000, burst_tokens=80_000, max_debt_tokens=20_000),
            tenant("b", sla_ms=30_000, max_queue_wait_ms=5000,
                   rate_tokens_per_s=40_000, burst_tokens=80_000, max_debt_tokens=20_000),
        ],
        models=[model("m8", prefill_s_per_token=2e-5, decode_s_per_token=0.008)],
        gpus=gpus, kv_budget_gib=kv_budget_gib, **kw,
    )


def workloads(rate_a: float = 6.0, rate_b: float = 3.0) -> tuple[Workload, ...]:
    return (
        Workload(
            tenant="a", model="m8", arrivals=OnOff(on_rate=2 * rate_a, on_s=5, off_s=5),
            prompt=LogNormal(median=500, sigma=0.5, lo=16, hi=3000),
            output=LogNormal(median=60, sigma=0.6, lo=1, hi=256), max_tokens=Const(256),
        ),
        Workload(
            tenant="b", model="m8", arrivals=Poisson(rate_b),
            prompt=LogNormal(median=1500, sigma=0.4, lo=64, hi=6000),
            output=LogNormal(median=200, sigma=0.5, lo=8, hi=1024), max_tokens=Const(1024),
        ),
    )


def scenario(
    *, duration_s: float = 60.0, seed: int = 1, rate_a: float = 6.0, rate_b: float = 3.0,
    **kw: Any,
) -> Scenario:
    return Scenario(
        name="small", config=sim_config(**kw), workloads=workloads(rate_a, rate_b),
        duration_s=duration_s, seed=seed, gpu_noise=0.1, sample_s=1.0,
    )
