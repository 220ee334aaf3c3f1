"""`triage bench core`: decisions per second and per-decision latency of the core.

A steady state: a pool of G GPUs held near full by running requests, a queue of
Q waiting requests, T tenants sending. Each measured step is one arrival's
decision (gate + dispatcher); completions keep the pool turning over between
arrivals (timed separately, not counted as decisions).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any

from triage.admission.core import AdmissionCore
from triage.config.models import TriageConfig


def bench_config(*, gpus: int, tenants: int, queue: int) -> TriageConfig:
    """A synthetic pool sized so that `queue` requests wait at steady state."""
    return TriageConfig.model_validate({
        "tenants": [
            {
                "name": f"t{i}", "rate_tokens_per_s": 1e9, "burst_tokens": 1e9,
                "max_debt_tokens": 1e6, "queue_max": queue, "max_queue_wait_ms": 3_600_000,
                "sla_ms": 3_600_000, "weight": 1.0 + (i % 4),
            }
            for i in range(tenants)
        ],
        "models": [{
            "name": "m", "pool": "p", "layers": 32, "kv_heads": 8, "head_dim": 128,
            "dtype": "bf16", "context_tokens": 32768,
        }],
        "gpu_types": [{"name": "g", "memory_gib": 80}],
        "pools": [{
            "name": "p", "gpu_type": "g", "gpus": [f"g{i}" for i in range(gpus)],
            "kv_budget_gib": 4, "queue_max": queue,
        }],
        "policy": {"preset": "full", "preemption": True},
    })


def run(
    *, gpus: int = 64, tenants: int = 100, queue: int = 500, decisions: int = 50_000,
    seed: int = 1,
) -> dict[str, Any]:
    rng = random.Random(seed)
    core = AdmissionCore(bench_config(gpus=gpus, tenants=tenants, queue=queue))
    d = core.dispatchers["p"]
    now = 0.0
    names = [f"t{i}" for i in range(tenants)]
    # warm up: fill GPUs and the queue
    i = 0
    while len(d.queue) < queue:
        now += 0.001
        core.submit(
            f"w{i}", rng.choice(names), "m", rng.randint(200, 2000), rng.randint(50, 800), now
        )
        i += 1
    lat: list[float] = []
    perf = time.perf_counter_ns
    submit = core.submit
    gc.collect()
    gc.disable()
    try:
        for k in range(decisions):
            now += 0.0005
            t = names[rng.randrange(tenants)]
            pt = rng.randint(200, 2000)
            mt = rng.randint(50, 800)
            t0 = perf()
            submit(f"r{k}", t, "m", pt, mt, now)
            lat.append(perf() - t0)
            # keep the pool turning: finish one runner for every arrival, keep the queue full
            if d.inflight and len(d.queue) >= queue:
                p = next(iter(d.inflight.values()))
                core.complete(
                    pool="p", request_id=p.request_id, attempt=p.attempt, ok=True,
                    output_tokens=int(p.expected_out), prefill_s=0.01, decode_s=0.5,
                    concurrency=4.0, now=now,
                )
            if k % 100 == 0:
                core.tick(now)
    finally:
        gc.enable()
    lat.sort()
    total_s = sum(lat) / 1e9
    return {
        "gpus": gpus, "tenants": tenants, "queue": queue, "decisions": decisions,
        "decisions_per_s": decisions / total_s,
        "median_us": statistics.median(lat) / 1000.0,
        "p99_us": lat[int(0.99 * len(lat))] / 1000.0,
        "queue_depth_end": len(d.queue),
    }


def scaling(*, decisions: int = 10_000, seed: int = 1) -> list[dict[str, Any]]:
    """Per-decision cost as each dimension grows alone around 64 GPUs x 100 tenants x 500
    queued: the curve should stay flat or grow like a logarithm."""
    grid = [(g, 100, 500) for g in (16, 64, 256)]
    grid += [(64, t, 500) for t in (10, 1000)]
    grid += [(64, 100, q) for q in (100, 2000)]
    out = []
    for gpus, tenants, queue in grid:
        r = run(gpus=gpus, tenants=tenants, queue=queue, decisions=decisions, seed=seed)
        out.append({"gpus": gpus, "tenants": tenants, "queue": queue,
                    "median_us": round(r["median_us"], 2), "p99_us": round(r["p99_us"], 2)})
    return out


def report(*, decisions: int = 50_000, scaling_decisions: int = 10_000) -> dict[str, Any]:
    """The JSON object `triage bench core` prints."""
    main = run(decisions=decisions)
    return {
        "decisions_per_s": round(main["decisions_per_s"]),
        "median_us": round(main["median_us"], 2),
        "p99_us": round(main["p99_us"], 2),
        "gpus": main["gpus"], "tenants": main["tenants"], "queue": main["queue"],
        "decisions": decisions,
        "compiled": compiled(),
        "scaling": scaling(decisions=scaling_decisions),
    }


def compiled() -> bool:
    """Whether the core runs as mypyc-compiled extension modules."""
    import triage.admission.dispatcher as d

    return not str(d.__file__).endswith(".py")
