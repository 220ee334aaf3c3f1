"""triage's NVML probe on a real GPU: what the worker's heartbeat would say while the
GPU is idle, holds memory, runs a trickle of tiny kernels, and runs flat out.

The point of the decoding phases: NVML's `utilization.gpu` is the share of time *any*
kernel ran, and one sequence decoding on an 8B model runs kernels back to back, so
one sequence reads like a busy GPU, as do 256 sequences with ~30x its tokens/s. That
is why admission's saturation signal is its own (KV reserved, sequence slots, queue
drain; docs/policy.md), not this number.

Needs PyTorch, nvidia-ml-py and triage's pure modules (pydantic). Run from the repo
root: `python3 ops/gpu/nvml_check.py --out nvml.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_costs import SHAPES, Decoder, Shape, report

from triage.config import load_config
from triage.workers.backends.base import EngineLoad
from triage.workers.nvml import NvmlProbe, gpu_status

GIB = 1 << 30


def _readings(probe: NvmlProbe, seconds: float, work: Any = None) -> list[dict[str, Any]]:
    """Read the probe every 0.25 s for `seconds` while `work()` runs between reads."""
    out = []
    end = time.perf_counter() + seconds
    next_read = time.perf_counter() + 0.25
    while time.perf_counter() < end:
        if work is not None:
            work()
        else:
            time.sleep(0.01)
        if time.perf_counter() >= next_read:
            r = probe.read()
            out.append({"utilization": r.utilization, "memory_used_gib":
                        None if r.memory_used_bytes is None else r.memory_used_bytes / GIB})
            next_read += 0.25
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per phase")
    ap.add_argument("--hold-gib", type=float, default=40.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    probe = NvmlProbe.open(0)
    if probe is None:
        raise SystemExit("NVML unavailable: no driver here")
    first = probe.read()
    config = load_config()
    gpu = config.all_gpus()[0]
    status = gpu_status(config=config, gpu_id=gpu, reading=first,
                        load=EngineLoad(running=0, waiting=0, kv_used_bytes=None,
                                        utilization=None), at_ms=int(time.time() * 1000))
    result: dict[str, Any] = {
        "reading": dataclasses.asdict(first),
        "heartbeat": json.loads(status.model_dump_json()),
        "phases": {},
    }
    phases = result["phases"]
    phases["idle"] = _readings(probe, a.seconds)
    held = torch.empty(int(a.hold_gib * GIB), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    phases["holding"] = _readings(probe, a.seconds)
    small = torch.randn(64, 64, device="cuda")

    def trickle() -> None:  # one tiny kernel, then 10 ms of nothing
        (small @ small).sum().item()
        time.sleep(0.01)

    phases["trickle_64x64_every_10ms"] = _readings(probe, a.seconds, trickle)
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def flat_out(big: torch.Tensor = big) -> None:
        for _ in range(20):
            big @ big
        torch.cuda.synchronize()

    phases["matmul_flat_out"] = _readings(probe, a.seconds, flat_out)
    del held
    torch.cuda.empty_cache()
    model = Decoder(Shape(**SHAPES["llama-3.1-8b"]), "cuda", torch.bfloat16)
    tokens: dict[str, float] = {}
    for batch in (1, 256):
        cache = model.cache(batch, 1025)
        ids = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
        done = [0]

        def step(ids: torch.Tensor = ids, cache: Any = cache, done: list[int] = done) -> None:
            with torch.inference_mode():
                model.forward(ids, cache, 1024, True)
            torch.cuda.synchronize()
            done[0] += ids.shape[0]

        t0 = time.perf_counter()
        phases[f"decoding_8b_batch_{batch}"] = _readings(probe, a.seconds, step)
        tokens[f"decoding_8b_batch_{batch}"] = done[0] / (time.perf_counter() - t0)
        del cache
        torch.cuda.empty_cache()
    result["tokens_per_s"] = tokens
    probe.close()
    result["summary"] = {
        name: {"utilization_median": sorted(x["utilization"] for x in rs)[len(rs) // 2],
               "memory_used_gib_max": max(x["memory_used_gib"] for x in rs)}
        for name, rs in phases.items() if rs
    }
    report(result, a.out)


if __name__ == "__main__":
    main()
