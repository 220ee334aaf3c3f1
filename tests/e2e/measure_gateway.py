"""Measure the gateway on the local broker (not a test: prints one JSON object).

    .venv/bin/python tests/e2e/measure_gateway.py [--requests 200] [--concurrency 8]
        [--tenants 1] [--tenant-topics per_tenant|shared]

Starts the admission app, one sim worker and the gateway (as the e2e tests do, on their
own topic prefix and free ports), then sends the same requests three ways: through the
gateway with the official openai client (non-streamed, then streamed), and directly with
TriageClient. Prints requests/s and latency percentiles of each, and time to first
token of the streamed run, so the gateway's own cost is the difference. With
`--tenants N` the gateway's requests go round-robin over N tenants' keys, and the
gateway's threads, memory and CPU are printed: one client per tenant it has served, or
one for all of them with `--tenant-topics shared`.
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
from harness import fast_config, gateway_running, running

from triage.client import InferenceRequest, TriageClient
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


def key(i: int) -> str:
    return f"{KEY}-{i}"


async def via_gateway(url: str, n: int, conc: int, stream: bool,
                      tenants: int = 1) -> dict[str, float]:
    clients = [openai.AsyncOpenAI(base_url=url, api_key=key(i), max_retries=0, timeout=120)
               for i in range(tenants)]
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    ttft: list[float] = []

    async def one(i: int) -> None:
        client = clients[i % tenants]
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
    await asyncio.gather(*(one(i) for i in range(n)))
    out = summary(lat, time.perf_counter() - t0)
    if stream:
        out["ttft_p50_ms"] = round(pct(ttft, 0.5), 1)
    for client in clients:
        await client.close()
    return out


def process_use(pid: int) -> dict[str, float]:
    """Threads, resident memory and CPU seconds of a process, from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {"threads": int(status["Threads"]),
            "rss_mb": round(int(status["VmRSS"].split()[0]) / 1024, 1),
            "cpu_s": round((int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"), 2)}


async def direct(bootstrap: str, names: TopicNames, n: int, conc: int) -> dict[str, float]:
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    async with TriageClient(bootstrap=bootstrap, tenant="acme", topic_prefix=names.prefix,
                            shared_topics=names.shared) as c:

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
    ap.add_argument("--tenants", type=int, default=1)
    ap.add_argument("--tenant-topics", choices=["per_tenant", "shared"], default="per_tenant")
    args = ap.parse_args()
    bootstrap = os.environ.get("TRIAGE_TEST_BOOTSTRAP", "127.0.0.1:9092")
    names = TopicNames.of(f"t{uuid.uuid4().hex[:8]}", args.tenant_topics)
    tmp = Path(tempfile.mkdtemp(prefix="triage-gw-measure-"))
    tenant = {"rate_tokens_per_s": 1e9, "burst_tokens": 1e9, "queue_max": 1000,
              "max_queue_wait_ms": 30_000, "sla_ms": 60_000}  # fmt: skip
    names_of = ["acme", *(f"acme{i}" for i in range(1, args.tenants))]
    cfg = fast_config(bootstrap, names, tmp, gpus=1,
                      tenants=[{"name": t, **tenant} for t in names_of],
                      kafka={"tenant_topics": args.tenant_topics})
    keys = tmp / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - tenant: {t}\n    sha256: {digest(key(i)).hex()}\n"
                                        for i, t in enumerate(names_of)))
    n, conc, k = args.requests, args.concurrency, args.tenants
    try:
        with running(cfg, tmp), gateway_running(tmp, keys) as (gw, url):
            assert gw.proc is not None
            asyncio.run(via_gateway(url, max(10, k), conc, False, k))  # warm up: clients
            out: dict[str, object] = {
                "requests": n, "concurrency": conc, "tenants": k,
                "tenant_topics": args.tenant_topics,
                "direct_client": asyncio.run(direct(bootstrap, names, n, conc)),
                "gateway": asyncio.run(via_gateway(url, n, conc, False, k)),
                "gateway_stream": asyncio.run(via_gateway(url, n, conc, True, k)),
                "gateway_process": process_use(gw.proc.pid),
            }  # fmt: skip
    finally:
        delete_topics(bootstrap, names.prefix)
    gateway, direct_client = out["gateway"], out["direct_client"]
    assert isinstance(gateway, dict) and isinstance(direct_client, dict)
    out["overhead_p50_ms"] = round(gateway["p50_ms"] - direct_client["p50_ms"], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
