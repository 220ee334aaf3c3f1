"""What a simulated run measured: per tenant and overall, in memory that does not
grow with the number of requests (counters, log histograms, fixed-interval series).

Definitions (the report and docs/experiments.md use these words):

- SLA attainment: requests that completed within their SLA / requests that arrived
  (a refusal or a timeout is a miss); `sla_attainment_completed` divides by completed.
- goodput: prompt + output tokens of requests that met their SLA, per GPU-second of
  the run (GPUs x makespan).
- queue wait: arrival to the start of the attempt that completed, on its GPU: the
  front-door queue and the engine's own queue both count, so admit-all (which
  queues inside the engine) is measured like the rest.
- preemption rate: (core preemptions + engine KV-overflow preemptions) / admitted.
- fairness: weighted max-min (water-filling) per series slot. A tenant's demand in a
  slot is the tokens that arrived for it, capped at its contracted rate (traffic over
  quota is not owed service); where demand exceeded what the pool served, the served
  tokens are the capacity to share, and each tenant's fair allocation is
  min(demand, weight x level) with the level filling the capacity. Over those
  contended slots, each tenant's served / allocated tokens: Jain's index over these
  ratios, and the max gap (largest minus smallest ratio, 0 = perfectly fair) among
  the tenants whose demand exceeded their allocation (the backlogged ones).
"""

from __future__ import annotations

from typing import Any

from triage.sim.histogram import LogHistogram
from triage.sim.series import TimeSeries

OUTCOMES = ("completed", "rejected", "timed_out", "failed", "unfinished")


class TenantStats:
    """Counters and histograms of one tenant (the engine calls these on decisions)."""

    __slots__ = (
        "_demand_key", "_served_key", "admitted", "completed", "core_preemptions",
        "engine_preemptions", "failed",
        "latency", "name", "queued", "queued_by_reason", "recompute_core", "recompute_engine",
        "rejected", "rejected_by_reason", "requests", "series", "sla_met", "timed_out",
        "tokens_completed", "tokens_met", "ttft", "unfinished", "wait", "weight",
    )  # fmt: skip

    def __init__(self, name: str, weight: float, series: TimeSeries) -> None:
        self.name = name
        self.weight = weight
        self.series = series
        self._demand_key = "demand:" + name  # series names, built once (a million adds)
        self._served_key = "served:" + name
        self.requests = 0
        self.admitted = 0  # dispatched at least once
        self.queued = 0  # waited in the front-door queue at least once
        self.queued_by_reason: dict[str, int] = {}  # why it waited (first QUEUE decision)
        self.completed = 0
        self.rejected = 0
        self.rejected_by_reason: dict[str, int] = {}
        self.timed_out = 0
        self.failed = 0
        self.unfinished = 0  # still live when the drain limit ended the run
        self.sla_met = 0
        self.tokens_met = 0
        self.tokens_completed = 0
        self.core_preemptions = 0
        self.engine_preemptions = 0
        self.recompute_core = 0
        self.recompute_engine = 0
        self.latency = LogHistogram()
        self.wait = LogHistogram()
        self.ttft = LogHistogram()

    # --- terminal outcomes: exactly one per request -----------------------------------
    def complete(
        self, *, arrived: float, sla_s: float, tokens: int, started: float, first_token: float,
        finished: float,
    ) -> None:
        self.completed += 1
        latency = finished - arrived
        self.latency.add(latency)
        wait = started - arrived
        self.wait.add(wait)
        self.ttft.add(first_token - arrived)
        self.tokens_completed += tokens
        if latency <= sla_s + 1e-9:
            self.sla_met += 1
            self.tokens_met += tokens
        self.series.add(self._served_key, finished, tokens)

    def queue(self, reason: str) -> None:
        """First time a request waits in the front-door queue."""
        self.queued += 1
        self.queued_by_reason[reason] = self.queued_by_reason.get(reason, 0) + 1

    def arrive(self, t: float, tokens: int) -> None:
        self.requests += 1
        self.series.add(self._demand_key, t, tokens)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1

    def timeout(self) -> None:
        self.timed_out += 1

    def fail(self) -> None:
        self.failed += 1

    @property
    def terminal(self) -> int:
        return self.completed + self.rejected + self.timed_out + self.failed + self.unfinished

    # --- summaries ------------------------------------------------------------------
    def summary(self, gpu_seconds: float) -> dict[str, Any]:
        n = self.requests
        return {
            "requests": n,
            "completed": self.completed,
            "rejected": self.rejected,
            "timed_out": self.timed_out,
            "failed": self.failed,
            "unfinished": self.unfinished,
            "rejected_by_reason": dict(sorted(self.rejected_by_reason.items())),
            "queued_by_reason": dict(sorted(self.queued_by_reason.items())),
            "acceptance": self.admitted / n if n else None,
            "queued_fraction": self.queued / n if n else None,
            "timeout_rate": self.timed_out / n if n else None,
            "sla_met": self.sla_met,
            "sla_attainment": self.sla_met / n if n else None,
            "sla_attainment_completed": self.sla_met / self.completed if self.completed else None,
            "goodput_tokens_per_gpu_s": self.tokens_met / gpu_seconds if gpu_seconds else 0.0,
            "tokens_completed": self.tokens_completed,
            "latency_s": self.latency.summary(),
            "queue_wait_s": self.wait.summary(),
            "ttft_s": self.ttft.summary(),
            "core_preemptions": self.core_preemptions,
            "engine_preemptions": self.engine_preemptions,
            "preemption_rate": (
                (self.core_preemptions + self.engine_preemptions) / self.admitted
                if self.admitted else 0.0
            ),
            "recompute_tokens_core": self.recompute_core,
            "recompute_tokens_engine": self.recompute_engine,
        }


def combine(stats: list[TenantStats], series: TimeSeries) -> TenantStats:
    """The overall row: sums of every tenant's counters and histograms."""
    total = TenantStats("all", 1.0, series)
    for s in stats:
        for name in (
            "requests", "admitted", "queued", "completed", "rejected", "timed_out", "failed",
            "unfinished", "sla_met", "tokens_met", "tokens_completed", "core_preemptions",
            "engine_preemptions", "recompute_core", "recompute_engine",
        ):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        for reason, n in s.rejected_by_reason.items():
            total.rejected_by_reason[reason] = total.rejected_by_reason.get(reason, 0) + n
        for reason, n in s.queued_by_reason.items():
            total.queued_by_reason[reason] = total.queued_by_reason.get(reason, 0) + n
        total.latency.merge(s.latency)
        total.wait.merge(s.wait)
        total.ttft.merge(s.ttft)
    return total


def water_fill(
    demand: dict[str, float], weights: dict[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min shares of `capacity`: min(demand, weight x level), filled."""
    alloc = dict.fromkeys(demand, 0.0)
    left = capacity
    open_ = {t for t, d in demand.items() if d > 0}
    while open_ and left > 1e-9:
        wsum = sum(weights[t] for t in open_)
        level = left / wsum
        done = {t for t in open_ if demand[t] - alloc[t] <= weights[t] * level}
        if not done:
            for t in open_:
                alloc[t] += weights[t] * level
            break
        for t in done:
            left -= demand[t] - alloc[t]
            alloc[t] = demand[t]
        open_ -= done
    return alloc


def fairness(
    series: TimeSeries, weights: dict[str, float], rates: dict[str, float]
) -> tuple[float | None, float | None, dict[str, float]]:
    """(Jain's index, max gap among backlogged tenants, served/allocated per tenant)
    over the contended slots (see the module docstring); Nones when none."""
    dt = series.interval
    demand = {t: series.counter("demand:" + t) for t in weights}
    served = {t: series.counter("served:" + t) for t in weights}
    got = dict.fromkeys(weights, 0.0)
    owed = dict.fromkeys(weights, 0.0)
    backlogged: set[str] = set()
    for i in range(series.n):
        want = {t: min(demand[t][i], rates[t] * dt) for t in weights}
        capacity = sum(served[t][i] for t in weights)
        if capacity <= 0 or sum(want.values()) <= capacity:
            continue
        alloc = water_fill(want, weights, capacity)
        for t in weights:
            if alloc[t] > 0:
                got[t] += served[t][i]
                owed[t] += alloc[t]
                if want[t] > alloc[t] + 1e-9:
                    backlogged.add(t)
    ratios = {t: got[t] / owed[t] for t in weights if owed[t] > 0}
    if len(ratios) < 2:
        return None, None, ratios
    xs = list(ratios.values())
    sq = sum(x * x for x in xs)
    jain = (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0
    hungry = [ratios[t] for t in backlogged if t in ratios]
    gap = max(hungry) - min(hungry) if len(hungry) >= 2 else 0.0
    return jain, gap, ratios
