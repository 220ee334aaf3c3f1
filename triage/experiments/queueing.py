"""Claim 1: a bounded queue in front of rejection-only admission cuts SLA violations.

The seed: on 16 A100s serving four tenants at 85% GPU utilization, rejection-only
admission control violated the SLA of 32% of requests; adding a bounded queue
(500 requests, 2 s) cut that to 9%.

Here: the shared pool (traffic.py) with offered tokens at 85% of its measured
capacity, under `reject_only` (quota, KV fit and SLA fit; whatever would wait is
refused) and the very same checks with the bounded queue switched on
(`reject_only+queue=true`: 500 requests per pool, 2 s per request, FIFO), plus the
`bounded_queue` preset (KV fit and the queue alone) for reference. An SLA
violation is a request that did not complete within its SLA: refused, timed out
in the queue, or late. Two pools: memory-bound (10 GiB of KV per GPU, where the
KV check refuses first) and compute-bound (30 GiB, where the SLA check does).
"""

from __future__ import annotations

from triage.experiments.base import (
    Experiment,
    ExperimentResult,
    pct,
    run_grid,
    run_summary,
    seeds_for,
)
from triage.experiments.traffic import shared_pool_grid

NAME = "queue"
CLAIM = "adding a bounded queue (500 requests, 2 s) to rejection-only admission cuts SLA " \
    "violations at 85% utilization"
SEED_FIGURE = "32% -> 9% SLA violations"
RHO = 0.85
DURATION_S = 900.0
GPUS = 4
BURST_S = 5.0
POOLS = {"memory-bound": 10.0, "compute-bound": 30.0}  # KV GiB per GPU
REJECT, QUEUE, PRESET = "reject_only", "reject_only+queue=true", "bounded_queue"
POLICIES = (REJECT, QUEUE, PRESET)


def run(scale: float, jobs: int) -> ExperimentResult:
    duration = DURATION_S * scale
    seeds = seeds_for(scale)
    grid = shared_pool_grid(
        RHO, pools=POOLS, seeds=seeds, policies=POLICIES, prefix="queue", duration_s=duration,
        gpus=GPUS, burst_s=BURST_S,
    )
    caps, rhos = grid.caps, grid.rhos
    by = run_grid(grid.specs, POLICIES, run_summary, jobs)
    mem, cpu = by["memory-bound"], by["compute-bound"]
    v = {pool: {p: by[pool][p]["sla_violations"] for p in POLICIES} for pool in POOLS}
    holds = v["memory-bound"][QUEUE] < v["memory-bound"][REJECT]
    ours = "; ".join(f"{pool}: {pct(v[pool][REJECT])} -> {pct(v[pool][QUEUE])}" for pool in POOLS)

    def per_seed(pool: str, p: str) -> str:
        return "/".join(pct(x) for x in by[pool][p]["by_seed"]["sla_violations"])

    notes = [
        f"load: offered tokens at {min(rhos):.1%}-{max(rhos):.1%} of the pool's saturated "
        "throughput, "
        + ", ".join(f"{pool} {sum(c) / len(c):,.0f} tokens/s" for pool, c in caps.items())
        + f"; GPU busy time {pct(mem[REJECT]['gpu_busy'])} / {pct(cpu[REJECT]['gpu_busy'])}",
        f"seeds {', '.join(map(str, seeds))}: memory-bound {per_seed('memory-bound', REJECT)} -> "
        f"{per_seed('memory-bound', QUEUE)}; compute-bound {per_seed('compute-bound', REJECT)} "
        f"-> {per_seed('compute-bound', QUEUE)}",
        f"memory-bound, rejection-only refuses {pct(mem[REJECT]['refused'])}; with the queue "
        f"{pct(mem[QUEUE]['timed_out'])} time out and {pct(mem[QUEUE]['late'])} are late",
        f"compute-bound, rejection-only refuses {pct(cpu[REJECT]['refused'])}; with the queue "
        f"{pct(cpu[QUEUE]['timed_out'])} time out and {pct(cpu[QUEUE]['late'])} are late",
        "bounded_queue preset (KV fit and queue only): memory-bound "
        f"{pct(mem[PRESET]['sla_violations'])}, compute-bound "
        f"{pct(cpu[PRESET]['sla_violations'])}",
    ]
    return ExperimentResult(
        name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, our_figure=ours,
        direction="memory-bound pool: fewer SLA violations with the queue than rejection-only",
        holds=holds, scale=scale, notes=notes,
        specs={s["name"]: s for by_seed in grid.specs.values() for s in by_seed.values()},
        metrics={
            "rho": RHO, "rho_achieved": rhos, "seeds": list(seeds),
            "capacity_tokens_per_s": {k: sum(c) / len(c) for k, c in caps.items()}, "runs": by,
        },
    )


EXPERIMENT = Experiment(name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, run_fn=run)
