"""Measure the gateway on the local broker (not a test: prints one JSON object).

    .venv/bin/python tests/e2e/measure_gateway.py [--requests 200] [--concurrency 8]

Starts the admission app, one sim worker and the gateway (as the e2e tests do, on their
own topic prefix and free ports), then sends the same requests three ways: through the
gateway with the official openai client (non-streamed, then streamed), and directly with
TriageClient. Prints requests/s and latency percentiles of each, and time to first
token of the streamed run, so the gateway's own cost is the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import openai
from harness import fast_config, free_port, running

from triage.client import InferenceRequest, TriageClient
from triage.demo.processes import ChildProcess, scrape
from triage.gateway.auth import digest
from triage.topics.admin import delete_topics
from triage.topics.names import TopicNames

KEY = "sk-triage-measure-" + uuid.uuid4().hex


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000.0


def summary(lat: list[float], wall: float) -> dict[str, float]:
    return {"requests_per_s": round(len(lat) / wall, 1), "p50_ms": round(pct(lat, 0.5), 1),
            "p99_ms": round(pct(lat, 0.99), 1)}  # fmt: skip


async def via_gateway(url: str, n: int, conc: int, stream: bool) -> dict[str, float]:
    client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    ttft: list[float] = []

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            if stream:
                first = None
                chunks = await client.completions.create(model="small", prompt="x" * 400,
                                                         max_tokens=64, stream=True)
                async for c in chunks:
                    if first is None and c.choices and c.choices[0].text:
                        first = time.perf_counter() - t0
                ttft.append(first or 0.0)
            else:
                await client.completions.create(model="small", prompt="x" * 400, max_tokens=64)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    out = summary(lat, time.perf_counter() - t0)
    if stream:
        out["ttft_p50_ms"] = round(pct(ttft, 0.5), 1)
    await client.close()
    return out


async def direct(bootstrap: str, prefix: str, n: int, conc: int) -> dict[str, float]:
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    async with TriageClient(bootstrap=bootstrap, tenant="acme", topic_prefix=prefix) as c:

        async def one() -> None:
            async with sem:
                t0 = time.perf_counter()
                await c.asubmit(InferenceRequest(tenant="acme", model="small", prompt_tokens=100,
                                                 max_tokens=64, prompt="x" * 400))
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return summary(lat, time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    bootstrap = os.environ.get("TRIAGE_TEST_BOOTSTRAP", "127.0.0.1:9092")
    names = TopicNames(f"t{uuid.uuid4().hex[:8]}")
    tmp = Path(tempfile.mkdtemp(prefix="triage-gw-measure-"))
    tenant = {"name": "acme", "rate_tokens_per_s": 1e9, "burst_tokens": 1e9, "queue_max": 1000,
              "max_queue_wait_ms": 30_000, "sla_ms": 60_000}  # fmt: skip
    cfg = fast_config(bootstrap, names, tmp, gpus=1, tenants=[tenant])
    keys = tmp / "keys.yaml"
    keys.write_text(f"keys:\n  - tenant: acme\n    sha256: {digest(KEY).hex()}\n")
    port = free_port()
    gw = ChildProcess("gateway", ["gateway", "--config", str(tmp / "triage.yaml"), "--keys",
                                  str(keys), "--port", str(port)], tmp / "gateway.log")
    url = f"http://127.0.0.1:{port}/v1"
    try:
        with running(cfg, tmp):
            gw.start()
            while scrape(f"http://127.0.0.1:{port}/live") is None:
                time.sleep(0.2)
            n, conc = args.requests, args.concurrency
            asyncio.run(via_gateway(url, 10, conc, False))  # warm up: the tenant's client
            out = {
                "requests": n, "concurrency": conc,
                "direct_client": asyncio.run(direct(bootstrap, names.prefix, n, conc)),
                "gateway": asyncio.run(via_gateway(url, n, conc, False)),
                "gateway_stream": asyncio.run(via_gateway(url, n, conc, True)),
            }  # fmt: skip
            gw.stop()
    finally:
        gw.stop()
        delete_topics(bootstrap, names.prefix)
    out["overhead_p50_ms"] = round(out["gateway"]["p50_ms"] - out["direct_client"]["p50_ms"], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
