"""The traffic the experiments run: scenarios built in code, so a load can be set.

`shared_pool(load, ...)` stands in for the seed's load test (four tenants on a pool
of A100s serving one 8B model): an interactive chat tenant and a code assistant
that come in bursts, a steady RAG tenant with long prompts, and a batch tenant
with a loose SLA. Every arrival rate is multiplied by `load`; the experiments pick
the load that puts offered tokens at a given fraction of the pool's measured
capacity (see base.capacity_tokens_per_s).

The A100 is modelled at half the speed of the H200 the model priors describe
(decode is memory-bandwidth bound: 2.0 vs 4.8 TB/s). Its KV budget sets which
resource runs out first: with 30 GiB (an 80 GB card less 16 GB of weights,
activations and headroom) the batch grows until predicted times reach the SLAs
(compute-bound); with 10 GiB (a 40 GB card) KV memory runs out first (memory-bound).

Each builder returns the scenario as a plain mapping too (`*_spec`), so `triage
experiments --out DIR` can write it as YAML for `triage sim` to rerun.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from triage.experiments.base import capacity_tokens_per_s, load_for, offered_tokens_per_s
from triage.sim.scenario import Scenario, scenario_from_dict

MODEL_8B: dict[str, Any] = {
    "name": "llama-3.1-8b", "pool": "a100", "layers": 32, "kv_heads": 8, "head_dim": 128,
    "dtype": "bf16", "context_tokens": 32768, "prefill_s_per_token": 0.00002,
    "decode_s_per_token": 0.008, "batch_slowdown": 0.02,
}


def a100_gpu_type(kv_gib: float) -> dict[str, Any]:
    """An A100 at half the priors' (H200's) speed; the 40 GB card when the KV budget fits."""
    return {"name": "A100", "memory_gib": 40 if kv_gib <= 20 else 80, "speed": 0.5}


def a100_pool(gpus: int, kv_gib: float = 30.0, queue_max: int = 500) -> dict[str, Any]:
    return {
        "name": "a100", "gpu_type": "A100", "gpus": [f"a100-{i}" for i in range(gpus)],
        "kv_budget_gib": kv_gib, "queue_max": queue_max,
    }


def lognormal(median: float, sigma: float, lo: int, hi: int) -> dict[str, Any]:
    return {"dist": "lognormal", "median": median, "sigma": sigma, "min": lo, "max": hi}


def shared_pool_spec(
    load: float, *, duration_s: float = 900.0, gpus: int = 4, seed: int = 5,
    gpu_noise: float = 0.15, name: str = "shared-pool", burst_s: float = 15.0,
    kv_gib: float = 30.0,
) -> dict[str, Any]:
    """Four tenants, one 8B model, `gpus` A100s; rates x `load` (per 4 GPUs)."""
    k = load * gpus / 4.0
    c = gpus / 4.0  # contracts are sized to the pool, not to the load
    tenants = [
        # contracts add up to more than the pool serves (the usual overcommit): quota
        # alone does not keep the pool out of overload
        {"name": "chat", "rate_tokens_per_s": 40000 * c, "burst_tokens": 120000 * c,
         "max_debt_tokens": 60000 * c, "queue_max": 200, "max_queue_wait_ms": 2000,
         "sla_ms": 10000, "weight": 2.0, "output_ratio_prior": 0.5},
        {"name": "code", "rate_tokens_per_s": 30000 * c, "burst_tokens": 90000 * c,
         "max_debt_tokens": 30000 * c, "queue_max": 200, "max_queue_wait_ms": 2000,
         "sla_ms": 15000, "weight": 1.5, "output_ratio_prior": 0.5},
        {"name": "rag", "rate_tokens_per_s": 30000 * c, "burst_tokens": 90000 * c,
         "max_debt_tokens": 30000 * c, "queue_max": 200, "max_queue_wait_ms": 2000,
         "sla_ms": 12000, "weight": 1.5, "output_ratio_prior": 0.5},
        {"name": "batch", "rate_tokens_per_s": 20000 * c, "burst_tokens": 100000 * c,
         "max_debt_tokens": 40000 * c, "queue_max": 300, "max_queue_wait_ms": 2000,
         "sla_ms": 60000, "weight": 1.0, "output_ratio_prior": 0.6},
    ]
    model = "llama-3.1-8b"
    workloads = [
        {"tenant": "chat", "model": model,
         "arrivals": {"process": "onoff", "on_rate": 9.0 * k, "off_rate": 1.5 * k,
                      "on_s": burst_s, "off_s": 2 * burst_s},
         "prompt": lognormal(800, 0.6, 16, 6000), "output": lognormal(100, 0.5, 1, 300),
         "max_tokens": 300},
        {"tenant": "code", "model": model,
         "arrivals": {"process": "onoff", "on_rate": 6.0 * k, "off_rate": 0.6 * k,
                      "on_s": burst_s * 2 / 3, "off_s": burst_s * 8 / 3},
         "prompt": lognormal(1500, 0.5, 16, 8000), "output": lognormal(150, 0.5, 4, 400),
         "max_tokens": 400},
        {"tenant": "rag", "model": model,
         "arrivals": {"process": "poisson", "rate": 2.0 * k},
         "prompt": lognormal(3000, 0.4, 64, 12000), "output": lognormal(120, 0.5, 8, 300),
         "max_tokens": 300},
        {"tenant": "batch", "model": model,
         "arrivals": {"process": "poisson", "rate": 0.6 * k},
         "prompt": lognormal(4000, 0.4, 256, 16000), "output": lognormal(400, 0.4, 16, 1200),
         "max_tokens": 1200},
    ]
    return {
        "name": name,
        "description": (
            f"Four tenants on {gpus} A100s serving Llama-3.1-8B, arrival rates x {load:.3f}: "
            "bursty chat and code, steady RAG with long prompts, batch with a loose SLA."
        ),
        "config": {
            "tenants": tenants, "models": [dict(MODEL_8B)], "gpu_types": [a100_gpu_type(kv_gib)],
            "pools": [a100_pool(gpus, kv_gib)], "policy": {"preset": "full"},
        },
        "workloads": workloads, "duration_s": duration_s, "seed": seed,
        "gpu_noise": gpu_noise, "sample_s": 5, "drain_limit_s": 600,
    }


def shared_pool(load: float, **kw: Any) -> Scenario:
    return scenario_from_dict(shared_pool_spec(load, **kw))


@lru_cache(maxsize=32)
def shared_pool_capacity(duration_s: float, **kw: Any) -> float:
    """Saturated throughput (tokens/s) of the shared pool on its traffic mix (cached per
    process: several experiments run the same pool). At most 300 s of overload."""
    return capacity_tokens_per_s(
        lambda load: shared_pool(load, duration_s=min(duration_s, 300.0), **kw)
    )


class PoolLoad(NamedTuple):
    spec: dict[str, Any]  # the scenario, as a mapping
    capacity: float  # saturated tokens/s of the pool on this mix
    rho: float  # offered tokens/s of the spec's own arrivals / capacity


def shared_pool_at(rho: float, *, duration_s: float, **kw: Any) -> PoolLoad:
    """The shared pool with offered tokens at `rho` x its measured capacity. Capacity is
    measured at the default timing noise whatever `gpu_noise` the run uses (noise moves
    it little, and one measurement then serves several experiments)."""
    shape = {k: v for k, v in kw.items() if k not in ("gpu_noise", "name")}
    cap = shared_pool_capacity(duration_s, **shape)
    load = load_for(lambda x: shared_pool(x, duration_s=duration_s, **shape), rho, cap)
    spec = shared_pool_spec(load, duration_s=duration_s, **kw)
    got = offered_tokens_per_s(scenario_from_dict(spec))
    return PoolLoad(spec, cap, got / cap if cap > 0 else 0.0)


class PoolGrid(NamedTuple):
    specs: dict[str, dict[int, dict[str, Any]]]  # pool -> seed -> scenario (run_grid's input)
    caps: dict[str, list[float]]  # pool -> measured capacity per seed
    rhos: list[float]  # achieved load of every run


def shared_pool_grid(
    rho: float, *, pools: dict[str, float], seeds: tuple[int, ...], policies: tuple[str, ...],
    prefix: str, duration_s: float, **kw: Any,
) -> PoolGrid:
    """The shared pool at `rho`, once per pool (name -> KV GiB per GPU) and seed, each
    scenario named PREFIX-POOL-sSEED (PREFIX-sSEED when the only pool is the prefix)."""
    grid = PoolGrid({pool: {} for pool in pools}, {pool: [] for pool in pools}, [])
    for pool, kv in pools.items():
        for seed in seeds:
            name = f"{prefix}-s{seed}" if pool == prefix else f"{prefix}-{pool}-s{seed}"
            spec, cap, got = shared_pool_at(
                rho, duration_s=duration_s, kv_gib=kv, name=name, seed=seed, **kw
            )
            grid.specs[pool][seed] = {**spec, "policies": list(policies)}
            grid.caps[pool].append(cap)
            grid.rhos.append(got)
    return grid

