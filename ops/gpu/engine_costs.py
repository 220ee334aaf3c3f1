"""Measure a model's serving costs on this GPU: the three priors triage's config takes
per model (`prefill_s_per_token`, `decode_s_per_token`, `batch_slowdown`).

A dense decoder of the model's shape (Llama: grouped-query attention, SwiGLU MLP,
RMSNorm) with random bf16 weights: the time of a forward pass does not depend on the
weights' values, so no checkpoint is needed. Prefill is timed per prompt length
(batch 1); a decode step is timed per batch size with every sequence at `--context`
tokens of KV in a preallocated cache (what a serving engine's paged cache holds).
triage's cost model is `prefill x prompt + output x step(n)` with `step(n) =
decode_s_per_token x (1 + batch_slowdown x (n - 1))`, so the script fits that line to
the decode steps and prints the three numbers, with every timing behind them.

It needs PyTorch and a CUDA GPU (`--device cpu --shape tiny` runs it anywhere, to
check the script). Run: `python3 ops/gpu/engine_costs.py --out costs.json`.
It is plain PyTorch, not vLLM: no paged-attention kernels, no CUDA graphs, so its
steps are an upper bound on a tuned engine's.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as nnf

# KV bytes per token: 2 x layers x kv_heads x head_dim x 2 (bf16)
SHAPES: dict[str, dict[str, int]] = {
    "llama-3.1-8b": {"hidden": 4096, "ffn": 14336, "layers": 32, "heads": 32, "kv_heads": 8,
                     "vocab": 128256},
    "llama-3.1-70b": {"hidden": 8192, "ffn": 28672, "layers": 80, "heads": 64, "kv_heads": 8,
                      "vocab": 128256},
    "tiny": {"hidden": 256, "ffn": 512, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 1000},
}


@dataclass
class Shape:
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class Decoder:
    """Weights of a Llama-shaped decoder and its forward pass over a KV cache."""

    def __init__(self, s: Shape, device: str, dtype: torch.dtype) -> None:
        self.s = s
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=dtype, generator=g) * 0.02

        kv = s.kv_heads * s.head_dim
        self.embed = w(s.vocab, s.hidden)
        self.layers = [
            {"qkv": w(s.hidden + 2 * kv, s.hidden), "o": w(s.hidden, s.hidden),
             "up": w(2 * s.ffn, s.hidden), "down": w(s.hidden, s.ffn),
             "n1": torch.ones(s.hidden, device=device, dtype=dtype),
             "n2": torch.ones(s.hidden, device=device, dtype=dtype)}
            for _ in range(s.layers)
        ]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.head = w(s.vocab, s.hidden)

    def cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.s
        shape = (batch, s.kv_heads, length, s.head_dim)
        return [(torch.zeros(shape, device=self.embed.device, dtype=self.embed.dtype),
                 torch.zeros(shape, device=self.embed.device, dtype=self.embed.dtype))
                for _ in range(s.layers)]

    def forward(self, ids: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]],
                pos: int, logits: bool) -> torch.Tensor:
        """Tokens `ids` (batch x T) at positions pos..pos+T-1; keys and values go into
        `cache`. Logits of the last position only (what sampling needs)."""
        s = self.s
        b, t = ids.shape
        x = nnf.embedding(ids, self.embed)
        kvd = s.kv_heads * s.head_dim
        for layer, (kc, vc) in zip(self.layers, cache, strict=True):
            h = nnf.rms_norm(x, (s.hidden,), layer["n1"])
            qkv = h @ layer["qkv"].T
            q = qkv[..., : s.hidden].view(b, t, s.heads, s.head_dim).transpose(1, 2)
            k = qkv[..., s.hidden : s.hidden + kvd].view(b, t, s.kv_heads, s.head_dim)
            v = qkv[..., s.hidden + kvd :].view(b, t, s.kv_heads, s.head_dim)
            kc[:, :, pos : pos + t] = k.transpose(1, 2)
            vc[:, :, pos : pos + t] = v.transpose(1, 2)
            a = nnf.scaled_dot_product_attention(
                q, kc[:, :, : pos + t], vc[:, :, : pos + t], is_causal=t > 1, enable_gqa=True
            )
            x = x + a.transpose(1, 2).reshape(b, t, s.hidden) @ layer["o"].T
            h = nnf.rms_norm(x, (s.hidden,), layer["n2"])
            gate, up = (h @ layer["up"].T).chunk(2, dim=-1)
            x = x + (nnf.silu(gate) * up) @ layer["down"].T
        x = nnf.rms_norm(x[:, -1:], (s.hidden,), self.norm)
        return x @ self.head.T if logits else x


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Any, args: tuple[Any, ...], device: str, reps: int) -> float:
    for _ in range(3):  # warm-up (kernel choice, allocator, clocks)
        fn(*args)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    _sync(device)
    return (time.perf_counter() - t0) / reps


def _decode_step_s(model: Decoder, batch: int, kv: int, gen: torch.Generator,
                   reps: int) -> float:
    """One decode step of `batch` sequences with `kv` tokens each in the cache. The step's
    cost depends on the KV it reads, not the values in it: the cache stays zero (a
    prefill of batch x kv tokens would only take time)."""
    device = str(model.embed.device)
    cache = model.cache(batch, kv + 1)
    ids = torch.randint(0, model.s.vocab, (batch, 1), device=device, generator=gen)
    t = _timed(model.forward, (ids, cache, kv, True), device, reps)
    del cache
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return t


def report(result: dict[str, Any], out: str | None) -> None:
    """Print the result as JSON, and write it to `out` too when given."""
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


def measure(shape: str, device: str, context: int, batches: list[int], prompts: list[int],
            reps: int, contexts: tuple[int, ...] = (), context_batch: int = 64) -> dict[str, Any]:
    s = Shape(**SHAPES[shape])
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = Decoder(s, device, dtype)
    out: dict[str, Any] = {"shape": shape, "dims": asdict(s), "device": device,
                           "context": context, "kv_bytes_per_token":
                           2 * s.layers * s.kv_heads * s.head_dim * 2}
    if device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(0)
    gen = torch.Generator(device=device).manual_seed(1)
    prefill: dict[int, float] = {}
    with torch.inference_mode():
        for n in prompts:
            cache = model.cache(1, n)
            ids = torch.randint(0, s.vocab, (1, n), device=device, generator=gen)
            prefill[n] = _timed(model.forward, (ids, cache, 0, True), device, reps)
            del cache
        steps = {b: _decode_step_s(model, b, context, gen, reps) for b in batches}
        by_context = {c: _decode_step_s(model, context_batch, c, gen, reps) for c in contexts}
    out["decode_step_s_by_context"] = {"batch": context_batch,
                                       **{str(c): t for c, t in by_context.items()}}
    out["prefill_s"] = {str(n): t for n, t in prefill.items()}
    out["prefill_s_per_token"] = {str(n): t / n for n, t in prefill.items()}
    out["decode_step_s"] = {str(b): t for b, t in steps.items()}
    # least squares step(n) = b0 + b1 (n - 1)
    xs = [b - 1.0 for b in steps]
    ys = list(steps.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    b0 = my - b1 * mx
    longest = max(prefill)
    out["fit"] = {
        "prefill_s_per_token": prefill[longest] / longest,
        "decode_s_per_token": b0,
        "batch_slowdown": b1 / b0 if b0 > 0 else math.nan,
        "max_abs_error_s": max(abs(b0 + b1 * x - y) for x, y in zip(xs, ys, strict=True)),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=1024,
                    help="KV tokens per sequence during the decode steps")
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--prompts", default="512,2048,8192")
    ap.add_argument("--contexts", default="512,2048,4096",
                    help="also time one step at these KV lengths (batch --context-batch)")
    ap.add_argument("--context-batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    result = measure(a.shape, a.device, a.context, [int(x) for x in a.batches.split(",")],
                     [int(x) for x in a.prompts.split(",")], a.reps,
                     tuple(int(x) for x in a.contexts.split(",") if x), a.context_batch)
    report(result, a.out)


if __name__ == "__main__":
    main()
