"""Prometheus metrics of the admission app, per tenant and per model.

Names are the contract with ops/grafana/dashboards/triage.json and docs/operations.md.
Each AdmissionMetrics owns its registry, so tests can build several side by side.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from triage.streams import fetch_sessions
from triage.streams.tallies import TallyCounter, TallyHistogram

Check = Callable[[], tuple[bool, str]]

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
DECISION_BUCKETS = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2)
DEPTH_BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500, 1000)
ERROR_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)

if TYPE_CHECKING:
    from triage.admission.core import AdmissionCore


def _fetched(pick: int) -> float:
    """Fetches sent by every consumer of this process: full (0), incremental (1), or
    how many of them waited for the first byte (2)."""
    sent = fetch_sessions.SENT
    return float((sent.full, sent.incremental, sent.long_waits)[pick])


class AdmissionMetrics:
    """Every series the admission app exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # read from the consumer's fetch sessions when scraped: nothing on the fetch path.
        # Fetch rate is what a trickle of traffic costs the consumer thread
        # (docs/architecture.md, "Fetches held a few milliseconds")
        self.fetches = Gauge(
            "triage_admission_fetches", "Fetch requests the consumer sent since start: full "
            "(naming every partition) or incremental (in a fetch session).", ["kind"],
            registry=r)
        for kind, pick in (("full", 0), ("incremental", 1)):
            self.fetches.labels(kind).set_function(partial(_fetched, pick))
        self.fetch_long_waits = Gauge(
            "triage_admission_fetch_long_waits", "Of those fetches, the ones sent after an "
            "empty one, which wait for the first byte (fetch_sessions.IDLE_WAIT_MS).",
            registry=r)
        self.fetch_long_waits.set_function(partial(_fetched, 2))
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._tenants_set: object = None  # the tenant collection whose gauges all exist
        self._tenant_depths: dict[str, int] = {}  # the non-zero per-tenant depths last set
        self._shard_depths: dict[int, dict[str, int]] = {}  # per held shard, its last tick's
        self._shard_buffers: dict[int, float] = {}
        self._buckets: set[tuple[str, int]] = set()  # (tenant, shard) series set
        self.admissions = TallyCounter(
            "triage_admissions", "Decisions by outcome and reason.",
            ["tenant", "model", "outcome", "reason"], registry=r)
        self.requests = TallyCounter(
            "triage_requests", "Requests read from tenants' topics (valid or not).",
            ["tenant"], registry=r)
        self.invalid = Counter(
            "triage_invalid_requests", "Requests answered `invalid` or dead-lettered.",
            ["tenant", "reason"], registry=r)
        self.duplicates = Counter(
            "triage_duplicate_requests", "Redelivered request ids answered from the record.",
            ["tenant"], registry=r)
        self.forwarded = Counter(
            "triage_forwarded", "Inputs read on another shard's partition (a producer that "
            "did not route by pool) and sent on to their own.", ["topic"], registry=r)
        self.handler_errors = Counter(
            "triage_handler_errors", "Messages whose handler raised: dead-lettered (a "
            "request naming a fresh id also answered `invalid`); the agent went on.",
            ["handler"], registry=r)
        self.queue_depth = Gauge(
            "triage_queue_depth", "Requests waiting, per pool.", ["pool"], registry=r)
        self.tenant_queue_depth = Gauge(
            "triage_tenant_queue_depth", "Requests waiting, per tenant.", ["tenant"], registry=r)
        self.queue_depth_hist = Histogram(
            "triage_queue_depth_observed", "Queue depth sampled every tick.", ["pool"],
            buckets=DEPTH_BUCKETS, registry=r)
        self.queue_wait = TallyHistogram(
            "triage_queue_wait_seconds", "Time spent queued, at dispatch or timeout.",
            ["tenant", "model"], buckets=WAIT_BUCKETS, registry=r)
        self.queue_timeouts = TallyCounter(
            "triage_queue_timeouts", "Queued requests that left without running.",
            ["tenant", "model", "reason"], registry=r)
        self.latency = TallyHistogram(
            "triage_request_latency_seconds", "Arrival to completion.", ["tenant", "model"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.sla_violations = TallyCounter(
            "triage_sla_violations", "Requests that missed their SLA, by cause.",
            ["tenant", "model", "cause"], registry=r)
        self.preemptions = TallyCounter(
            "triage_preemptions", "Running requests preempted.", ["tenant", "model"],
            registry=r)
        self.preemption_rate = Gauge(
            "triage_preemption_rate", "Preemptions per dispatch, per pool.", ["pool"],
            registry=r)
        self.recompute_tokens = TallyCounter(
            "triage_recompute_tokens", "Tokens prefilled again after preemption.",
            ["tenant", "model"], registry=r)
        self.predictor_error = TallyHistogram(
            "triage_predictor_relative_error", "Actual / predicted execution time.",
            ["model"], buckets=ERROR_BUCKETS, registry=r)
        self.variance_buffer = Gauge(
            "triage_variance_buffer", "Factor applied to predictions.", registry=r)
        self.decision_latency = TallyHistogram(
            "triage_decision_latency_seconds", "Time in the core per event.",
            ["event"], buckets=DECISION_BUCKETS, registry=r)
        self.gpu_utilization = Gauge(
            "triage_gpu_utilization", "Compute utilization reported by the worker.",
            ["pool", "gpu"], registry=r)
        self.kv_reserved = Gauge(
            "triage_kv_reserved_bytes", "KV bytes reserved on the ledger.", ["pool", "gpu"],
            registry=r)
        self.kv_budget = Gauge(
            "triage_kv_budget_bytes", "KV budget of the GPU.", ["pool", "gpu"], registry=r)
        self.pool_utilization = Gauge(
            "triage_pool_utilization", "Utilization seen by the hysteresis monitor.", ["pool"],
            registry=r)
        self.tightened = Gauge(
            "triage_admission_tightened", "1 while the pool is above its high threshold.",
            ["pool"], registry=r)
        self.autoscale = Gauge(
            "triage_autoscale_signal", "1 while an autoscale-up signal stands.", ["pool"],
            registry=r)
        self.bucket_level = Gauge(
            "triage_bucket_tokens", "Token bucket level (negative: debt); a bucket per "
            "tenant and shard.", ["tenant", "shard"], registry=r)
        self.gpus_up = Gauge("triage_gpus_up", "GPUs taking work, per pool.", ["pool"], registry=r)
        self.ready = Gauge(
            "triage_admission_ready", "1 while the app is deciding (the same check as /ready).",
            registry=r)
        self.server: ThreadingHTTPServer | None = None

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: prometheus-client's lookup costs microseconds
        and the admission path touches several series per request."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def observe_core(self, core: AdmissionCore, tenants: Iterable[str], shard: int = 0) -> None:
        """Set the gauges that sample the core's state (once per tick). `shard`: whose
        core this is; an instance holding several shards sums their tenants' queue
        depths (each shard sets its own pools' gauges, and the largest buffer shows)."""
        per_tenant: dict[str, int] = {}
        for name, d in core.dispatchers.items():
            depth = len(d.queue)
            self.queue_depth.labels(name).set(depth)
            self.queue_depth_hist.labels(name).observe(depth)
            for t, c in d.queue.tenant_count.items():
                per_tenant[t] = per_tenant.get(t, 0) + c
            self.preemption_rate.labels(name).set(d.stats.preemption_rate)
            self.pool_utilization.labels(name).set(d.monitor.utilization)
            self.tightened.labels(name).set(1 if d.monitor.tightened else 0)
            self.autoscale.labels(name).set(1 if d.monitor.autoscale else 0)
            self.gpus_up.labels(name).set(d.ledger.up_count())
            for s in d.ledger.slots:
                self.kv_reserved.labels(name, s.gpu_id).set(s.used)
                self.kv_budget.labels(name, s.gpu_id).set(s.budget)
        self._shard_depths[shard] = per_tenant
        self._shard_buffers[shard] = core.predictor.variance_buffer
        if len(self._shard_depths) > 1:
            total: dict[str, int] = {}
            for depths in self._shard_depths.values():
                for t, n in depths.items():
                    total[t] = total.get(t, 0) + n
            per_tenant = total
        self._observe_tenant_depths(per_tenant, tenants)
        self.variance_buffer.set(max(self._shard_buffers.values()))

    def set_bucket(self, tenant: str, shard: int, level: float) -> None:
        self._buckets.add((tenant, shard))
        self.child(self.bucket_level, tenant, str(shard)).set(level)

    def forget_shard(self, shard: int) -> None:
        """`shard` moved to another instance: its buckets' series go, and its queues no
        longer count in the tenants' depths (from the next tick on)."""
        self._shard_depths.pop(shard, None)
        self._shard_buffers.pop(shard, None)
        for tenant, s in [k for k in self._buckets if k[1] == shard]:
            self._buckets.discard((tenant, s))
            self._children.pop((id(self.bucket_level), (tenant, str(s))), None)
            self.bucket_level.remove(tenant, str(s))

    def _observe_tenant_depths(self, depths: dict[str, int], tenants: Iterable[str]) -> None:
        """Per-tenant queue depths, touching only the tenants whose depth changed: with
        1,000 tenants, setting every gauge on every tick cost 6% of the app's CPU."""
        if tenants is not self._tenants_set:  # first tick, or the config changed
            self._tenants_set = tenants
            self._tenant_depths = {}
            for t in tenants:
                self.child(self.tenant_queue_depth, t).set(depths.get(t, 0))
        last = self._tenant_depths
        for t, n in depths.items():
            if last.get(t) != n:
                self.child(self.tenant_queue_depth, t).set(n)
        for t in last.keys() - depths.keys():
            self.child(self.tenant_queue_depth, t).set(0)
        self._tenant_depths = {t: n for t, n in depths.items() if n}

    def serve(self, host: str, port: int, *, ready: Check | None = None,
              live: Check | None = None) -> int:
        """Expose /metrics, /ready and /live over HTTP on its own thread (port 0 disables;
        returns the bound port). The readiness gauge is set from `ready` at every scrape,
        so it can never disagree with /ready."""
        if not port:
            return 0
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    if ready is not None:
                        metrics.ready.set(1 if ready()[0] else 0)
                    self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
                elif path in ("/ready", "/live"):
                    check = ready if path == "/ready" else live
                    ok, why = check() if check is not None else (True, "ok")
                    if path == "/ready":
                        metrics.ready.set(1 if ok else 0)
                    self._send(200 if ok else 503, f"{why}\n".encode(), "text/plain")
                else:
                    self._send(404, b"try /metrics, /ready or /live\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass  # scrapes every few seconds must not flood the log

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="admission-http",
                         daemon=True).start()
        self.server = server
        return int(server.server_address[1])
