"""`triage bench sim`: simulator throughput (requests per wall second) and memory.

A streamed run of N requests (default 1,000,000) through the full policy on a busy
pool of 8 GPUs: four tenants with Poisson arrivals and lognormal prompt and output
lengths, GPU timing noise on, loaded so the queue is rarely empty and ~2-3% of
requests are refused or time out (the core's busy path, not its idle one). Memory is sampled
along the way (RSS every tenth of the run) to show it stays flat: the arrivals are
generated lazily and the simulator holds only live requests and fixed-size metrics.
"""

from __future__ import annotations

import cProfile
import gc
import io
import itertools
import pstats
import resource
import sys
import time
from typing import Any

import psutil

from triage.config.models import TriageConfig
from triage.sim.arrivals import Poisson
from triage.sim.compare import resolve
from triage.sim.dists import LogNormal
from triage.sim.engine import SimOptions, Simulator
from triage.sim.scenario import Scenario
from triage.sim.workload import Workload, generate

RATE_PER_GPU = 11.0  # requests/s per GPU for the mix below (7.0: a healthy, quiet pool)


def bench_config(*, gpus: int, tenants: int) -> TriageConfig:
    """One pool of `gpus` H200-like GPUs, one 8B model, `tenants` equal tenants."""
    return TriageConfig.model_validate({
        "tenants": [
            {
                "name": f"t{i}", "rate_tokens_per_s": 1e6, "burst_tokens": 1e6,
                "max_debt_tokens": 1e5, "queue_max": 200, "max_queue_wait_ms": 5000,
                "sla_ms": 15000, "weight": 1.0 + (i % 2), "output_ratio_prior": 0.5,
            }
            for i in range(tenants)
        ],
        "models": [{
            "name": "m8", "pool": "p", "layers": 32, "kv_heads": 8, "head_dim": 128,
            "dtype": "bf16", "context_tokens": 32768, "prefill_s_per_token": 2e-5,
            "decode_s_per_token": 0.008, "batch_slowdown": 0.02,
        }],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{
            "name": "p", "gpu_type": "H200", "gpus": [f"g{i}" for i in range(gpus)],
            "kv_budget_gib": 40, "queue_max": 1000,
        }],
        "policy": {"preset": "full"},
    })


def bench_scenario(*, gpus: int = 8, tenants: int = 4, seed: int = 1) -> Scenario:
    config = bench_config(gpus=gpus, tenants=tenants)
    rate = RATE_PER_GPU * gpus / tenants
    workloads = tuple(
        Workload(
            tenant=f"t{i}", model="m8", arrivals=Poisson(rate),
            prompt=LogNormal(median=800, sigma=0.8, lo=16, hi=16000),
            output=LogNormal(median=120, sigma=0.8, lo=1, hi=2048),
            max_factor=2.0, max_cap=2048,
        )
        for i in range(tenants)
    )
    return Scenario(
        name="bench", config=config, workloads=workloads, duration_s=1e9, seed=seed,
        gpu_noise=0.1,
    )


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def run(
    *, requests: int = 1_000_000, gpus: int = 8, tenants: int = 4, policy: str = "full",
    seed: int = 1, profile: bool = False,
) -> dict[str, Any]:
    """Simulate `requests` arrivals; returns the figures `triage bench sim --json` prints."""
    sc = bench_scenario(gpus=gpus, tenants=tenants, seed=seed)
    name, pc = resolve(sc, policy)
    arrivals = itertools.islice(
        generate(list(sc.workloads), sc.config, seed=seed, duration_s=1e9), requests
    )
    rss: list[tuple[int, float]] = [(0, _rss_mb())]
    step = max(1, requests // 10)

    def progress(_now: float, n: int) -> None:
        if n >= rss[-1][0] + step:
            rss.append((n, _rss_mb()))

    sim = Simulator(
        sc.config, arrivals, policy=pc,
        options=SimOptions(seed=seed, gpu_noise=sc.gpu_noise, sample_s=10.0,
                           progress_every=max(1, step // 4)),
        scenario="bench", policy_name=name, progress=progress,
    )
    prof = cProfile.Profile() if profile else None
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    result = sim.run()
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    rss.append((result.arrivals, _rss_mb()))
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    o = result.overall
    out: dict[str, Any] = {
        "requests": result.arrivals,
        "requests_per_s": result.arrivals / wall if wall > 0 else 0.0,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_cpu_s": result.arrivals / cpu if cpu > 0 else 0.0,
        "peak_rss_mb": peak_kb / 1024.0,
        "rss_mb_by_requests": [[n, round(mb, 1)] for n, mb in rss],
        "decisions": result.decisions,
        "decisions_per_s": result.decisions / wall if wall > 0 else 0.0,
        "virtual_s": result.makespan_s,
        "policy": name, "gpus": gpus, "tenants": tenants,
        "sla_attainment": o["sla_attainment"], "acceptance": o["acceptance"],
        "gpu_utilization": o["gpu_utilization"], "conserved": result.conserved,
        "python": sys.version.split()[0],
    }
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        out["profile"] = buf.getvalue()
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(requests=int(sys.argv[1]) if len(sys.argv) > 1 else 100_000), indent=1))
