"""Prometheus metrics of one GPU worker, on its own registry and port
(``metrics.worker_port_base`` + the GPU's index in the config). Every series carries
the ``gpu`` label so a dashboard can sum or split workers without relabelling."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class WorkerMetrics:
    """The worker's series. Names are part of the ops contract (dashboard, alerts)."""

    def __init__(self, gpu_id: str, registry: CollectorRegistry | None = None) -> None:
        self.gpu_id = gpu_id
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        g = ["gpu"]
        self.running = Gauge(
            "triage_worker_running_sequences",
            "Sequences running on the GPU (holding KV)",
            g,
            registry=r,
        )
        self.waiting = Gauge(
            "triage_worker_waiting_sequences",
            "Sequences queued inside the serving engine",
            g,
            registry=r,
        )
        self.utilization = Gauge(
            "triage_worker_gpu_utilization",
            "GPU compute utilization, 0..1 (NVML or the sim's busy share)",
            g,
            registry=r,
        )
        self.kv_bytes = Gauge(
            "triage_worker_kv_bytes_in_use",
            "KV-cache bytes in use (sim) or device memory used (NVML)",
            g,
            registry=r,
        )
        self.kv_budget = Gauge(
            "triage_worker_kv_budget_bytes", "The pool's KV budget per GPU", g, registry=r
        )
        self.simulated = Gauge(
            "triage_worker_simulated", "1 when no NVML device backs this worker", g, registry=r
        )
        self.healthy = Gauge(
            "triage_worker_gpu_healthy", "1 when the GPU reports healthy", g, registry=r
        )
        self.attempts = Counter(
            "triage_worker_attempts",
            "Attempts ended, by outcome (completed, failed, preempted, cancelled)",
            ["gpu", "tenant", "model", "status"],
            registry=r,
        )
        self.output_tokens = Counter(
            "triage_worker_output_tokens",
            "Tokens generated",
            ["gpu", "tenant", "model"],
            registry=r,
        )
        self.duplicates = Counter(
            "triage_worker_duplicates_skipped",
            "Redelivered work items not run again",
            g,
            registry=r,
        )
        self.heartbeats = Counter("triage_worker_heartbeats", "Heartbeats published", g, registry=r)
        self.completion_messages = Counter(
            "triage_worker_completion_messages",
            "Messages published to the completions topic (each holds one Completion or a "
            "CompletionBatch: attempts over this is completions per message)",
            g,
            registry=r,
        )
        self.prefill = Histogram(
            "triage_worker_prefill_seconds",
            "Measured time to first token per attempt",
            ["gpu", "model"],
            buckets=_SECONDS,
            registry=r,
        )
        self.ttft = Histogram(
            "triage_worker_ttft_seconds",
            "Wall time from the request's arrival at admission to its first token, per "
            "completed attempt (queueing included: what a client waits)",
            ["gpu", "model"],
            buckets=_SECONDS,
            registry=r,
        )
        self.stream_chunks = Counter(
            "triage_worker_stream_chunks",
            "Streaming replies (token chunks) published to tenants' reply topics",
            g,
            registry=r,
        )
        self.kv_usage = Gauge(
            "triage_worker_engine_kv_usage",
            "The serving engine's KV-cache usage, 0..1 (vLLM /metrics, or the sim's model)",
            g,
            registry=r,
        )
        self.decode = Histogram("triage_worker_decode_seconds",
                                "Measured decode time per attempt", ["gpu", "model"],
                                buckets=_SECONDS, registry=r)  # fmt: skip
        self._server: Any = None

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP endpoint; return the bound port (port 0 picks one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        bound: int = server.server_port
        log.info("worker %s metrics on http://%s:%d/metrics", self.gpu_id, host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
