"""Micro-benchmark of the GPU timing model (``triage.sim.gpu.SimulatedGpu``).

The virtual-time simulator must push a million requests through at more than 25,000
requests per wall second including the admission core, so the timing model has to be
a small share of that budget. This drives one simulated GPU with Poisson arrivals
near its capacity (lognormal prompt and output lengths) and counts calls per second.

Run: ``python -m triage.bench.gpu_model [SEQUENCES]``.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from typing import Any

from triage.config.load import load_config
from triage.sim.gpu import gpu_from_config


def bench_gpu_model(
    sequences: int = 200_000, *, seed: int = 0, load: float = 0.9, noise: float = 0.1
) -> dict[str, Any]:
    """Drive ``sequences`` requests through one GPU; return throughput figures.

    ``events_per_s`` counts model calls (submit + advance to each event) per CPU
    second; each sequence costs about three (submit, prefill end, finish).
    """
    config = load_config()
    gpu = gpu_from_config(config, config.all_gpus()[0], noise=noise, seed=seed)
    model = config.models_of_pool(config.pool_of_gpu(gpu.gpu_id).name)[0]  # type: ignore[union-attr]
    rng = random.Random(seed)
    # Rough service rate: ~64 concurrent sequences of ~200 tokens each at batch step time.
    step = model.decode_s_per_token * (1 + model.batch_slowdown * 63)
    rate = load * 64 / (200 * step)
    work: list[tuple[float, int, int]] = []  # pre-drawn, so only the model is timed
    arrival = 0.0
    for _ in range(sequences):
        arrival += rng.expovariate(rate)
        prompt = min(8000, max(1, int(rng.lognormvariate(math.log(500), 0.8))))
        output = max(1, min(2000, int(rng.lognormvariate(math.log(150), 0.7))))
        work.append((arrival, prompt, output))
    name = model.name
    calls = finished = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    for i, (arrival, prompt, output) in enumerate(work):
        while (t := gpu.next_event_time()) is not None and t <= arrival:
            finished += len(gpu.advance(t))
            calls += 1
        gpu.submit(i, model=name, prompt_tokens=prompt, output_tokens=output, now=arrival)
        calls += 1
    while (t := gpu.next_event_time()) is not None:
        finished += len(gpu.advance(t))
        calls += 1
    wall = time.perf_counter() - started
    cpu = max(1e-9, time.process_time() - cpu_started)
    return {
        "sequences": sequences,
        "finished": finished,
        "calls": calls,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "events_per_s": round(calls / cpu),  # per CPU second: robust on a shared machine
        "sequences_per_s": round(sequences / cpu),
        "simulated_s": round(gpu.now, 1),
        "engine_preemptions": gpu.engine_preemptions,
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    print(json.dumps(bench_gpu_model(n)))


if __name__ == "__main__":
    main()
