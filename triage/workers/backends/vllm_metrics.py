"""The serving engine's own load, read from vLLM's Prometheus endpoint (``/metrics``).

What predicts queueing is the engine's state, not NVML's utilization (busy whenever one
sequence runs): sequences running and waiting inside the engine and the share of its
KV cache in use. vLLM exports them as

* ``vllm:num_requests_running``  (gauge) sequences in the running batch
* ``vllm:num_requests_waiting``  (gauge) sequences queued inside the engine
* ``vllm:kv_cache_usage_perc``   (gauge, 0..1 despite the name; vLLM V1), or the older
  ``vllm:gpu_cache_usage_perc``

one series per served model (label ``model_name``). Counts are summed over the series,
KV usage is the largest one (several engines behind one endpoint share no cache). The
text is parsed with prometheus_client's parser; a server that exports none of these
gives no reading (the heartbeat then carries none: "unknown", not zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # newest first
STALE_AFTER = 3  # readings older than this many intervals are dropped


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One scrape of the engine's load; a field is None when the server does not export it."""

    running: int | None
    waiting: int | None
    kv_usage: float | None  # 0..1
    at: float  # monotonic seconds


def parse_vllm_metrics(text: str, at: float = 0.0) -> EngineReading | None:
    """The engine's load from a /metrics page; None when none of the series is there.

    Raises ValueError for text that is not Prometheus exposition format.
    """
    sums: dict[str, float] = {}
    kv: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in (RUNNING, WAITING):
                sums[name] = sums.get(name, 0.0) + sample.value
            elif name in KV_USAGE:
                kv[name] = max(kv.get(name, 0.0), sample.value)
    usage = next((kv[n] for n in KV_USAGE if n in kv), None)
    if not sums and usage is None:
        return None
    return EngineReading(
        running=_count(sums.get(RUNNING)),
        waiting=_count(sums.get(WAITING)),
        kv_usage=None if usage is None else min(1.0, max(0.0, usage)),
        at=at,
    )


def metrics_url_for(base_url: str) -> str:
    """vLLM serves /metrics at the server's root: ``http://h:8000/v1`` -> ``http://h:8000/metrics``."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


class MetricsPoller:
    """Scrapes the endpoint every ``interval_s`` in a task; ``latest()`` is never stale."""

    def __init__(self, url: str, interval_s: float, headers: dict[str, str]) -> None:
        self.url = url
        self.interval_s = interval_s
        self._headers = headers
        self._reading: EngineReading | None = None
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self.scrapes = 0
        self.failures = 0

    def start(self, session: aiohttp.ClientSession) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(session), name=f"metrics {self.url}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def latest(self) -> EngineReading | None:
        r = self._reading
        if r is None or time.monotonic() - r.at > STALE_AFTER * self.interval_s:
            return None
        return r

    async def scrape(self, session: aiohttp.ClientSession) -> EngineReading | None:
        """One scrape; logs (once until it recovers) and returns None on any failure."""
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.interval_s * 2))
        try:
            async with session.get(self.url, headers=self._headers, timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                reading = parse_vllm_metrics(await resp.text(), time.monotonic())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.failures += 1
            if not self._warned:
                log.warning("cannot read engine metrics from %s (%s); heartbeats carry no "
                            "engine load until it answers", self.url, exc)  # fmt: skip
                self._warned = True
            return None
        self.scrapes += 1
        if reading is None and not self._warned:
            log.warning("%s exports no vLLM load series (%s, %s, %s)", self.url, RUNNING,
                        WAITING, KV_USAGE[0])  # fmt: skip
            self._warned = True
        elif reading is not None:
            self._warned = False
        self._reading = reading
        return reading

    async def _run(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.scrape(session)
            await asyncio.sleep(self.interval_s)


def _count(value: float | None) -> int | None:
    return None if value is None else max(0, round(value))
