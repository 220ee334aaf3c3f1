"""Prometheus metrics of the gateway, served on its own port at /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    """The gateway's series. Names are part of the ops contract (docs/operations.md)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "triage_gateway_requests",
            "HTTP requests answered, by endpoint and status code",
            ["tenant", "endpoint", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "triage_gateway_latency_seconds",
            "From the HTTP request to its last byte (the terminal reply, or the stream's end)",
            ["tenant", "endpoint"],
            buckets=_SECONDS,
            registry=r,
        )
        self.ttft = Histogram(
            "triage_gateway_ttft_seconds",
            "Streamed requests: from the HTTP request to the first token sent",
            ["tenant", "model"],
            buckets=_SECONDS,
            registry=r,
        )
        self.auth_failures = Counter(
            "triage_gateway_auth_failures", "Requests refused for a missing or bad API key",
            registry=r,
        )
        self.in_flight = Gauge(
            "triage_gateway_in_flight", "Requests waiting for their terminal reply", ["tenant"],
            registry=r,
        )
