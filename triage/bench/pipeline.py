"""`triage bench pipeline`: requests through the real admission app on the local broker.

Two phases on a fresh set of topics, with the admission app and one simulated worker
per GPU running as processes:

1. latency: requests offered at `latency_rate` per second; the time from a request's
   produce to its first decision record (p50, p99);
2. throughput: requests offered as fast as the producer can for `burst_requests`;
   decisions of new requests per second, sustained, from the first to the last.

Requests are small and tenants' quotas large, so the numbers measure the pipeline
(Kafka in, Faust, the core, Kafka out), not the policy refusing work.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import OFFSET_END, TopicPartition

from triage.config.models import TriageConfig
from triage.demo.processes import ChildProcess, wait_for_metric
from triage.kafka.clients import broker_reachable, make_consumer, make_producer
from triage.kafka.local import LocalBroker
from triage.topics.admin import create_topics, delete_topics
from triage.topics.messages import InferenceRequest
from triage.topics.names import TopicNames

log = logging.getLogger(__name__)
TENANTS = ("t0", "t1", "t2", "t3")


def bench_config(bootstrap: str, prefix: str, run_dir: Path, *, gpus: int) -> TriageConfig:
    tenant = {"rate_tokens_per_s": 1e12, "burst_tokens": 1e12, "queue_max": 100_000,
              "max_queue_wait_ms": 600_000, "sla_ms": 600_000}
    return TriageConfig.model_validate({
        "tenants": [{"name": t, **tenant} for t in TENANTS],
        "models": [{"name": "tiny", "pool": "p", "layers": 16, "kv_heads": 8, "head_dim": 64,
                    "dtype": "bf16", "context_tokens": 4096, "prefill_s_per_token": 1e-6,
                    "decode_s_per_token": 0.001, "batch_slowdown": 0.001}],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": "p", "gpu_type": "H200", "gpus": [f"g{i}" for i in range(gpus)],
                   "kv_budget_gib": 120, "queue_max": 100_000}],
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": prefix},
        "admission": {"datadir": str(run_dir / "admission-data")},
        "metrics": {"admission_port": 19408, "worker_port_base": 19410},
    })


class DecisionClock:
    """Reads the decisions topic and stamps each request's first decision."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._c = make_consumer(bootstrap, f"bench-{topic}")
        self._c.assign([TopicPartition(topic, 0, OFFSET_END)])
        self.first: dict[str, int] = {}  # request_id -> decision at_ms
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._t.start()

    def _run(self) -> None:
        import json

        while not self._stop.is_set():
            for m in self._c.consume(num_messages=2000, timeout=0.2):
                if m.error() is not None:
                    continue
                d = json.loads(m.value() or b"{}")
                rid = d.get("request_id")
                if rid is not None and rid not in self.first:
                    self.first[rid] = int(d["at_ms"])

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)
        self._c.close()


def _offer(bootstrap: str, names: TopicNames, prefix: str, n: int, rate: float | None,
           sent: dict[str, int]) -> float:
    """Produce n requests (at `rate` per second, or flat out); returns the offered rate."""
    p = make_producer(bootstrap, **{"linger.ms": 2})
    start = time.time()
    for i in range(n):
        if rate is not None:
            due = start + i / rate
            while (now := time.time()) < due:
                p.poll(min(0.002, due - now))
        rid = f"{prefix}-{i}"
        t = TENANTS[i % len(TENANTS)]
        now_ms = int(time.time() * 1000)
        req = InferenceRequest(request_id=rid, tenant=t, model="tiny", prompt_tokens=32,
                               max_tokens=4, created_at_ms=now_ms,
                               metadata={"sim_output_tokens": "2"})
        sent[rid] = now_ms
        p.produce(names.requests(t), key=rid.encode(), value=req.to_bytes())
        if i % 200 == 0:
            p.poll(0)
    p.flush(30)
    return n / max(1e-9, time.time() - start)


def _wait(clock: DecisionClock, ids: dict[str, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(r in clock.first for r in ids):
            return
        time.sleep(0.2)


def run(*, latency_rate: float = 1000.0, latency_requests: int = 15_000,
        burst_requests: int = 30_000, gpus: int = 2, port: int = 9092,
        bootstrap: str | None = None,
        out_dir: Path = Path("reports/bench-pipeline")) -> dict[str, Any]:
    """On `bootstrap` when given (a broker that must already run), else on the local
    broker on `port`, started if none answers (and stopped after)."""
    broker = LocalBroker(port=port)
    server = bootstrap or broker.bootstrap
    started = False
    if bootstrap is None and not broker_reachable(server, timeout_s=3.0):
        started = broker.start().started
    stamp = time.strftime("%Y%m%d%H%M%S")
    prefix = f"bench{stamp}"
    run_dir = out_dir / stamp
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = bench_config(server, prefix, run_dir, gpus=gpus)
    cfg_path = run_dir / "triage.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    names = TopicNames(prefix)
    create_topics(server, names, cfg)
    procs = [ChildProcess("admission", ["admission", "--config", str(cfg_path), "--loglevel",
                                        "warn"], run_dir / "admission.log")]
    procs += [ChildProcess(f"worker-{g}", ["worker", "--gpu", g, "--backend", "sim",
                                           "--config", str(cfg_path)],
                           run_dir / f"worker-{g}.log") for g in cfg.all_gpus()]
    clock = DecisionClock(server, names.decisions)
    try:
        for p in procs:
            p.start()
        url = f"http://127.0.0.1:{cfg.metrics.admission_port}/metrics"
        if not wait_for_metric(url, "triage_admission_ready 1.0", timeout_s=120,
                               proc=procs[0]):
            raise RuntimeError(f"admission app did not start:\n{procs[0].tail()}")
        clock.start()
        time.sleep(2.0)  # the workers' first heartbeats
        lat_ids: dict[str, int] = {}
        offered = _offer(server, names, "lat", latency_requests, latency_rate,
                         lat_ids)
        _wait(clock, lat_ids, 120)
        lat = sorted(clock.first[r] - t for r, t in lat_ids.items() if r in clock.first)
        burst_ids: dict[str, int] = {}
        burst_offered = _offer(server, names, "burst", burst_requests, None,
                               burst_ids)
        _wait(clock, burst_ids, 300)
        stamps = sorted(clock.first[r] for r in burst_ids if r in clock.first)
        span_s = (stamps[-1] - stamps[0]) / 1000.0 if len(stamps) > 1 else float("nan")
        return {
            "requests_per_s": round(len(stamps) / span_s, 1) if span_s > 0 else None,
            "offered_per_s": round(burst_offered, 1),
            "burst_requests": burst_requests,
            "burst_decided": len(stamps),
            "latency_offered_per_s": round(offered, 1),
            "latency_requests": latency_requests,
            "latency_decided": len(lat),
            "p50_ms": statistics.median(lat) if lat else None,
            "p99_ms": lat[int(0.99 * (len(lat) - 1))] if lat else None,
            "max_ms": lat[-1] if lat else None,
            "gpus": gpus,
            "run_dir": str(run_dir),
        }
    finally:
        clock.stop()
        for p in reversed(procs):
            p.stop()
        try:
            delete_topics(server, prefix)
        except Exception as exc:  # cleanup is best effort
            log.warning("could not delete bench topics: %s", exc)
        if started:
            broker.stop()
