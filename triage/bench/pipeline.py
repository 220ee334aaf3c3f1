"""`triage bench pipeline`: triage beside the ceilings it runs under, in one run, on one
broker, interleaved: each repetition measures, in turn,

1. triage: the admission app (`--instances` processes) and one simulated worker per
   GPU, as processes, on fresh topics. Latency: requests offered at `latency_rate`;
   p50/p99 from a request's produce to its first decision record. Throughput, with
   completions flowing: `burst_requests` offered flat out; first decisions per second,
   completions per second, and the admission process's CPU per completed request;
2. the broker's ceiling: confluent-kafka produce and consume (ceilings.py);
3. the Faust engine's ceilings: relay, table, skeleton (ceiling_app.py).

The figures are the medians over the repetitions, and the ratios are taken between the
medians. A rate counts outputs (decision records, completions) from the moment the
first input was offered to the last one's own timestamp. Requests are small and
tenants' quotas large, so triage's figures measure the pipeline (Kafka in, Faust, the
core, Kafka out), not the policy refusing work.

Every child is stopped by pid when the run ends, whatever ends it (children.py).
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import OFFSET_END, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from triage.bench.ceiling_app import CeilingKind
from triage.bench.ceilings import broker_ceiling, faust_ceiling, request_bytes
from triage.bench.children import (
    BenchStartError,
    Fleet,
    cpu_seconds,
    signals_unwind,
)
from triage.bench.leftovers import claim, release, sweep
from triage.config.models import TriageConfig
from triage.demo.processes import ChildProcess, scrape, wait_for_metric
from triage.kafka.clients import broker_reachable, make_consumer, make_producer
from triage.kafka.local import LocalBroker
from triage.ports import free_port, free_run
from triage.topics.admin import TopicSpec, create_topics, delete_topics, ensure_topics
from triage.topics.names import TopicKind, TopicNames
from triage.topics.shards import request_routes

log = logging.getLogger(__name__)
MAX_TENANTS = 2_000  # each is a request topic the app subscribes to


def tenant_names(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]
COMPLETE = "complete"  # the outcome of a decision record at a request's end
QUEUE = "queue"  # the outcome of a request's first decision when it waits before it starts
STALL_S = 20.0  # waiting for decisions ends when none came for this long


def instances_problem(instances: int, pools: int = 1) -> str | None:
    """Why `--instances N` cannot run with `--pools`, or None: the app is sharded by pool
    (one shard per pool here), and an instance without a shard has nothing to do."""
    if instances <= pools:
        return None
    return (f"--instances {instances} needs at least as many --pools (one shard each; "
            f"--pools is {pools})")


def bench_config(bootstrap: str, prefix: str, run_dir: Path, *, gpus: int, pools: int = 1,
                 tenants: int = 4, shards: int = 1,
                 overrides: dict[str, Any] | None = None) -> TriageConfig:
    """The bench's config: `gpus` GPUs spread over `pools` pools (one model each),
    `tenants` tenants with large quotas, and metrics ports free at this moment; with
    `shards` > 1 the app is sharded, pool j on partition j mod shards. `overrides` are
    merged in (tests)."""
    if gpus < pools:
        raise ValueError(f"--gpus {gpus} is fewer than --pools {pools}: each pool needs one")
    tenant = {"rate_tokens_per_s": 1e12, "burst_tokens": 1e12, "queue_max": 100_000,
              "max_queue_wait_ms": 600_000, "sla_ms": 600_000}
    model = {"layers": 16, "kv_heads": 8, "head_dim": 64, "dtype": "bf16",
             "context_tokens": 4096, "prefill_s_per_token": 1e-6,
             "decode_s_per_token": 0.001, "batch_slowdown": 0.001}
    data: dict[str, Any] = {
        "tenants": [{"name": t, **tenant} for t in tenant_names(tenants)],
        "models": [{"name": f"tiny{j}", "pool": f"p{j}", **model} for j in range(pools)],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": f"p{j}", "gpu_type": "H200", "kv_budget_gib": 120,
                   "queue_max": 100_000,
                   "gpus": [f"g{i}" for i in range(gpus) if i % pools == j],
                   "partition": j % shards}
                  for j in range(pools)],
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": prefix,
                  "request_partitions": shards, "admission_partitions": shards},
        "admission": {"datadir": str(run_dir / "admission-data")},
        "metrics": {"admission_port": free_port(), "worker_port_base": free_run(gpus)},
    }
    for section, values in (overrides or {}).items():
        data[section] = {**data.get(section, {}), **values}
    return TriageConfig.model_validate(data)


class DecisionClock:
    """Reads the decisions topic: each request's first decision and its completion."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._c = make_consumer(bootstrap, f"bench-{topic}")
        md = self._c.list_topics(topic, timeout=10.0)
        self._c.assign([TopicPartition(topic, n, OFFSET_END)
                        for n in sorted(md.topics[topic].partitions)])
        self.first: dict[str, int] = {}  # request_id -> decision at_ms
        self.first_outcome: dict[str, str] = {}  # request_id -> its first decision's outcome
        # request_id -> when this read_committed reader got its first decision record
        # (what a client sees: after the record's transaction committed)
        self.seen: dict[str, int] = {}
        self.done: dict[str, int] = {}  # request_id -> completion at_ms
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # poll returns on the first record; consume(timeout=0.2) waited out its timeout
            # whenever fewer than 2,000 were there, so `seen` read up to 200 ms late
            first = self._c.poll(0.2)
            if first is None:
                continue
            for m in [first, *self._c.consume(num_messages=2000, timeout=0)]:
                if m.error() is not None:
                    continue
                d = json.loads(m.value() or b"{}")
                rid = d.get("request_id")
                if rid is None:
                    continue
                if rid not in self.first:
                    self.first[rid] = int(d["at_ms"])
                    self.first_outcome[rid] = str(d.get("outcome"))
                self.seen.setdefault(rid, int(time.time() * 1000))
                if d.get("outcome") == COMPLETE:
                    self.done.setdefault(rid, int(d["at_ms"]))

    def stop(self) -> None:
        self._stop.set()
        if self._t.is_alive():
            self._t.join(timeout=5)
        self._c.close()


def _offer(bootstrap: str, names: TopicNames, tag: str, n: int, rate: float | None,
           models: list[str], tenant_list: list[str], sent: dict[str, int],
           routes: dict[str, int] | None = None) -> float:
    """Produce n requests at `rate` per second, or flat out (built beforehand, so that
    the producer outruns the app); returns the offered rate. `routes`: model ->
    partition (a sharded app's, as a client built from the config sends them)."""
    routes = routes or {}
    p = make_producer(bootstrap, **{"linger.ms": 2})
    p.list_topics(names.requests(tenant_list[0]), timeout=10)  # connected before the clock
    warm_up(p, bootstrap, f"{names.prefix}.bench-warmup")
    tenants = [tenant_list[i % len(tenant_list)] for i in range(n)]
    built = [] if rate is not None else [
        request_bytes(f"{tag}-{i}", tenants[i], models[i % len(models)],
                      int(time.time() * 1000)) for i in range(n)]
    start = time.time()
    for i in range(n):
        rid = f"{tag}-{i}"
        if rate is not None:
            due = start + i / rate
            while (now := time.time()) < due:
                p.poll(min(0.002, due - now))
        now_ms = int(time.time() * 1000)
        value = built[i] if built else request_bytes(rid, tenants[i], models[i % len(models)],
                                                     now_ms)
        sent[rid] = now_ms
        p.produce(names.requests(tenants[i]), key=rid.encode(), value=value,
                  partition=routes.get(models[i % len(models)], -1))
        if i % 200 == 0:
            p.poll(0)
    p.flush(30)
    return n / max(1e-9, time.time() - start)


def warm_up(producer: Producer, bootstrap: str, topic: str) -> None:
    """Hold the clock until the producer can send at once. An idempotent producer asks
    the broker for its producer id on a timer after it is created, and holds every
    message until it has one: the first ~450 ms of a fresh producer's messages waited
    that long (at 500/s, the first 225 requests of the latency phase; 1% of 5,000 is
    50, so p99 read the client's start, not the app). One message to a topic of its own,
    acknowledged, means the id is there."""
    ensure_topics(bootstrap, [TopicSpec(topic, TopicKind.ADMISSION, 1, 1)])
    producer.produce(topic, value=b"warm-up")
    if producer.flush(30) != 0:
        raise BenchStartError(f"the bench's producer could not write to {topic}")


def _wait(seen: dict[str, int], ids: dict[str, int], timeout_s: float) -> None:
    """Until every id is in `seen`, or none arrived for STALL_S, or the timeout."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        have = sum(1 for r in ids if r in seen)
        if have == len(ids):
            return
        if have != last:
            last, since = have, time.monotonic()
        elif time.monotonic() - since > STALL_S:
            return
        time.sleep(0.2)


def _rate(stamps_ms: list[int], since_ms: int) -> float:
    """Stamps per second from `since_ms` (when the first was offered) to the last."""
    if not stamps_ms:
        return 0.0
    return len(stamps_ms) / (max(1, max(stamps_ms) - since_ms) / 1000.0)


def triage_phase(fleet: Fleet, server: str, cfg: TriageConfig, cfg_path: Path, run_dir: Path,
                 *, instances: int, latency_rate: float, latency_requests: int,
                 burst_requests: int, warmup_requests: int = 0) -> dict[str, Any]:
    names = TopicNames.of(cfg.kafka.topic_prefix, cfg.kafka.tenant_topics)
    create_topics(server, names, cfg)
    ports = [cfg.metrics.admission_port, *(free_port() for _ in range(instances - 1))]
    admissions = [ChildProcess(f"admission-{i}", [
        "admission", "--config", str(cfg_path), "--loglevel", "warn", "--instance", str(i),
        "--datadir", str(run_dir / f"admission-{i}-data"), "--metrics-port", str(port),
    ], run_dir / f"admission-{i}.log") for i, port in enumerate(ports)]
    workers = [ChildProcess(f"worker-{g}", ["worker", "--gpu", g, "--backend", "sim",
                                            "--config", str(cfg_path)],
                            run_dir / f"worker-{g}.log") for g in cfg.all_gpus()]
    models = [m.name for m in cfg.models]
    tenant_list = [t.name for t in cfg.tenants]
    clock = DecisionClock(server, names.decisions)
    try:
        for p in [*admissions, *workers]:
            fleet.start(p)
        for p, port in zip(admissions, ports, strict=True):
            url = f"http://127.0.0.1:{port}/metrics"
            if not wait_for_metric(url, "triage_admission_ready 1.0", timeout_s=180, proc=p):
                raise BenchStartError(f"{p.name} did not start: {_last_line(p)}")
        dead = [w.name for w in workers if not w.alive()]
        if dead:
            raise BenchStartError(f"{dead[0]} exited: {_last_line(workers[0])}")
        clock.start()
        time.sleep(2.0)  # the workers' first heartbeats
        routes = request_routes(cfg)  # as a client built from the config sends them
        # A freshly started app's first second is slower (its first fetches, sends and
        # transactions): measured apart, so p99 is the steady state's.
        warm_ids: dict[str, int] = {}
        if warmup_requests:
            _offer(server, names, "warm", warmup_requests, latency_rate, models, tenant_list,
                   warm_ids, routes)
            _wait(clock.first, warm_ids, 120)
        warm = sorted(clock.first[r] - t for r, t in warm_ids.items() if r in clock.first)
        pids = [p.proc.pid for p in admissions if p.proc is not None]
        # CPU at a paced load: every second's fixed work (ticks, polls, commits) included,
        # so instances compare at equal load each (--instances: docs/architecture.md)
        paced_cpu0 = sum(cpu_seconds(pid) for pid in pids)
        lat_ids: dict[str, int] = {}
        offered = _offer(server, names, "lat", latency_requests, latency_rate, models,
                         tenant_list, lat_ids, routes)
        _wait(clock.first, lat_ids, 120)
        lat = sorted(clock.first[r] - t for r, t in lat_ids.items() if r in clock.first)
        seen = sorted(clock.seen[r] - t for r, t in lat_ids.items() if r in clock.seen)
        (run_dir / "latency.json").write_text(json.dumps(sorted(
            (t, clock.first[r] - t) for r, t in lat_ids.items() if r in clock.first
        )))  # (produce ms, produce to first decision ms) of each request: where stalls fell
        _wait(clock.done, lat_ids, 300)  # the burst's CPU is the burst's alone
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        paced_done = sum(1 for r in lat_ids if r in clock.done)
        burst_ids: dict[str, int] = {}
        burst_offered = _offer(server, names, "burst", burst_requests, None, models,
                               tenant_list, burst_ids, routes)
        _wait(clock.first, burst_ids, 300)
        _wait(clock.done, burst_ids, 600)
        cpu_s = sum(cpu_seconds(pid) for pid in pids) - cpu0
        per_message = completions_per_message(cfg)
        decided = [clock.first[r] for r in burst_ids if r in clock.first]
        done = [clock.done[r] for r in burst_ids if r in clock.done]
        since = min(burst_ids.values())
        queued = sum(1 for r in burst_ids if clock.first_outcome.get(r) == QUEUE)
        return {
            "completed_per_s": _rate(done, since),
            "decisions_per_s": _rate(decided, since),
            "p50_ms": float(statistics.median(lat)) if lat else None,
            "p99_ms": float(lat[int(0.99 * (len(lat) - 1))]) if lat else None,
            "max_ms": float(lat[-1]) if lat else None,
            "visible_p50_ms": float(statistics.median(seen)) if seen else None,
            "visible_p99_ms": float(seen[int(0.99 * (len(seen) - 1))]) if seen else None,
            "warmup_p99_ms": float(warm[int(0.99 * (len(warm) - 1))]) if warm else None,
            "warmup_max_ms": float(warm[-1]) if warm else None,
            "admission_cpu_us_per_request": cpu_s / len(done) * 1e6 if done else None,
            "paced_cpu_us_per_request": ((cpu0 - paced_cpu0) / paced_done * 1e6
                                         if paced_done else None),
            "burst_offered_per_s": burst_offered, "burst_decided": len(decided),
            "burst_completed": len(done), "latency_offered_per_s": offered,
            "burst_queued_share": queued / len(decided) if decided else None,
            "latency_decided": len(lat), "completions_per_message": per_message,
        }
    finally:
        clock.stop()
        fleet.stop(*admissions, *workers)


def completions_per_message(cfg: TriageConfig) -> float | None:
    """Attempts the workers ended over the messages they sent to the completions topic
    (CompletionBatch): each message costs the admission app one event."""
    attempts = messages = 0.0
    for i in range(len(cfg.all_gpus())):
        text = scrape(f"http://127.0.0.1:{cfg.metrics.worker_port_base + i}/metrics")
        if text is None:
            return None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "triage_worker_attempts_total":
                    attempts += sample.value
                elif sample.name == "triage_worker_completion_messages_total":
                    messages += sample.value
    return attempts / messages if messages else None


def _last_line(child: ChildProcess) -> str:
    lines = [ln for ln in child.tail(20).splitlines() if ln.strip()]
    return lines[-1] if lines else f"no output (see {child.log_path})"


CEILINGS = ((CeilingKind.RELAY, "faust_relay_ceiling_per_s", "faust_relay_cpu_us_per_msg"),
            (CeilingKind.TABLE, "faust_table_ceiling_per_s", "faust_table_cpu_us_per_msg"),
            (CeilingKind.SKELETON, "faust_skeleton_ceiling_per_s",
             "faust_skeleton_cpu_us_per_request"),
            (CeilingKind.MATCHED, "faust_matched_skeleton_ceiling_per_s",
             "faust_matched_skeleton_cpu_us_per_request"))


def repetition(fleet: Fleet, server: str, run_prefix: str, run_dir: Path, rep: int, *,
               gpus: int, pools: int, tenants: int, instances: int, broker_messages: int,
               ceiling_messages: int, overrides: dict[str, Any] | None, shards: int = 1,
               **triage_sizes: Any) -> dict[str, Any]:
    """One of each measurement, in turn, on fresh topics under `run_prefix` (the Faust
    ceilings always on one partition: the engine's own ceiling)."""
    rep_dir = run_dir / f"r{rep}"
    rep_dir.mkdir(parents=True, exist_ok=True)
    cfg = bench_config(server, f"{run_prefix}-r{rep}", rep_dir, gpus=gpus, pools=pools,
                       tenants=tenants, shards=shards, overrides=overrides)
    cfg_path = rep_dir / "triage.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    ceiling_path = cfg_path
    if shards > 1:
        ceiling_path = rep_dir / "ceilings.yaml"
        one = bench_config(server, f"{run_prefix}-r{rep}", rep_dir, gpus=gpus, pools=pools,
                           tenants=tenants, overrides=overrides)
        ceiling_path.write_text(yaml.safe_dump(one.model_dump(mode="json")))
    out = triage_phase(fleet, server, cfg, cfg_path, rep_dir, instances=instances,
                       **triage_sizes)
    b = broker_ceiling(server, f"{run_prefix}-b{rep}.broker", broker_messages)
    out["broker_produce_per_s"], out["broker_consume_per_s"] = (b["produce_per_s"],
                                                                b["consume_per_s"])
    for kind, rate_key, cpu_key in CEILINGS:
        c = faust_ceiling(fleet, kind=kind, bootstrap=server, config_path=ceiling_path,
                          base=f"{run_prefix}-c{rep}-{kind.value}", n=ceiling_messages,
                          run_dir=rep_dir, queued_share=out.get("burst_queued_share") or 0.0,
                          worker=cfg.worker)
        out[rate_key], out[cpu_key] = c["per_s"], c["cpu_us"]
        if "items_per_message" in c:
            out["matched_items_per_message"] = c["items_per_message"]
    return out


RATIOS = (  # name, numerator, denominator
    ("triage_vs_skeleton", "completed_per_s", "faust_skeleton_ceiling_per_s"),
    ("triage_vs_matched_skeleton", "completed_per_s", "faust_matched_skeleton_ceiling_per_s"),
    ("skeleton_vs_table", "faust_skeleton_ceiling_per_s", "faust_table_ceiling_per_s"),
    ("table_vs_relay", "faust_table_ceiling_per_s", "faust_relay_ceiling_per_s"),
    ("relay_vs_broker", "faust_relay_ceiling_per_s", "broker_per_s"),
    ("triage_cpu_vs_skeleton", "admission_cpu_us_per_request",
     "faust_skeleton_cpu_us_per_request"),
    ("triage_cpu_vs_matched_skeleton", "admission_cpu_us_per_request",
     "faust_matched_skeleton_cpu_us_per_request"),
)


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of every figure over the repetitions, and the ratios between the medians.
    `broker_per_s` is the slower of produce and consume."""
    out: dict[str, Any] = {}
    for key in reps[0]:
        values = [r[key] for r in reps if isinstance(r.get(key), int | float)]
        digits = 3 if key.endswith("_share") else 1
        out[key] = round(float(statistics.median(values)), digits) if values else None
    brokers = [out.get("broker_produce_per_s"), out.get("broker_consume_per_s")]
    out["broker_per_s"] = min(brokers) if all(brokers) else None  # type: ignore[type-var]
    cpu = out["admission_cpu_us_per_request"]
    out["admission_cpu_s_per_1000_requests"] = round(cpu / 1000, 3) if cpu else None
    for name, num, den in RATIOS:
        a, b = out.get(num), out.get(den)
        out[name] = round(a / b, 3) if a and b else None
    return out


def run(*, latency_rate: float = 500.0, latency_requests: int = 5_000,
        warmup_requests: int = 500, burst_requests: int = 10_000, gpus: int = 2,
        pools: int = 1, tenants: int = 4,
        instances: int = 1, shards: int | None = None,
        repetitions: int = 3, broker_messages: int = 100_000, ceiling_messages: int = 10_000,
        port: int = 9092, bootstrap: str | None = None,
        out_dir: Path = Path("reports/bench-pipeline"),
        overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """On `bootstrap` when given (a broker that must already run), else on the local
    broker on `port`, started if none answers (and stopped after)."""
    problem = instances_problem(instances, pools)
    if problem is not None:
        raise ValueError(problem)
    shards = shards if shards is not None else (pools if instances > 1 else 1)
    if not 1 <= shards <= pools:
        raise ValueError(f"--shards {shards} is outside 1..--pools ({pools})")
    if gpus < pools:
        raise ValueError(f"--gpus {gpus} is fewer than --pools {pools}: each pool needs one")
    if not 1 <= tenants <= MAX_TENANTS:
        raise ValueError(f"--tenants {tenants} is outside 1..{MAX_TENANTS}")
    broker = LocalBroker(port=port)
    server = bootstrap or broker.bootstrap
    started = reached = False
    run_prefix = f"bench{time.strftime('%Y%m%d%H%M%S')}{uuid.uuid4().hex[:4]}"
    run_dir = out_dir / run_prefix
    fleet = Fleet()
    with signals_unwind():
        try:
            if bootstrap is None and not broker_reachable(server, timeout_s=3.0):
                started = broker.start().started
            reached = True
            run_dir.mkdir(parents=True, exist_ok=True)
            claim(run_dir)
            try:  # what runs killed before this one left behind (best effort)
                sweep(server, out_dir)
            except Exception as exc:
                log.warning("could not delete the topics of earlier killed runs: %s", exc)
            reps = [repetition(fleet, server, run_prefix, run_dir, i + 1, gpus=gpus,
                               pools=pools, tenants=tenants, instances=instances,
                               shards=shards, broker_messages=broker_messages,
                               ceiling_messages=ceiling_messages, overrides=overrides,
                               latency_rate=latency_rate, latency_requests=latency_requests,
                               warmup_requests=warmup_requests,
                               burst_requests=burst_requests)
                    for i in range(repetitions)]
            out = summarize(reps)
            out.update({"repetitions": repetitions, "instances": instances, "pools": pools,
                        "shards": shards,
                        "tenants": tenants,
                        "tenant_topics": (overrides or {}).get("kafka", {}).get(
                            "tenant_topics", "per_tenant"),
                        "gpus": gpus, "burst_requests": burst_requests,
                        "latency_requests": latency_requests,
                        "warmup_requests": warmup_requests,
                        "ceiling_messages": ceiling_messages,
                        "broker_messages": broker_messages, "run_dir": str(run_dir),
                        "per_repetition": reps})
            (run_dir / "result.json").write_text(json.dumps(out, indent=1))
            return out
        finally:
            fleet.stop_all()
            try:
                if reached:
                    delete_topics(server, run_prefix)
                    release(run_dir)
            except Exception as exc:  # cleanup is best effort
                log.warning("could not delete bench topics: %s", exc)
            if started:
                broker.stop()
