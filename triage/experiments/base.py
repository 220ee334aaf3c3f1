"""What every experiment shares: its definition, its result, and the runner.

An experiment is a claim of the seed article turned into something anyone can
rerun: a scenario (built in code, so its load can be set from a measurement),
the policies it compares, the quantity it measures, the seed's figure, and the
*direction* the claim implies (which policy should come out ahead). `scale`
shortens the run (CI uses about a tenth) without changing its shape: durations
shrink, rates, burst lengths and the pool stay, so the load stays.

Runs of one experiment are independent simulations; `jobs > 1` runs them in
worker processes (the measuring functions are module-level, so they pickle),
and results do not depend on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from triage.sim.capacity import capacity_tokens_per_s, load_for, offered_tokens_per_s
from triage.sim.compare import run_policy
from triage.sim.result import SimResult
from triage.sim.scenario import Scenario, scenario_from_dict

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "Experiment", "ExperimentResult", "capacity_tokens_per_s", "load_for",
    "offered_tokens_per_s", "parallel_map", "run_grid", "summarize",
]


@dataclass(slots=True, kw_only=True)
class ExperimentResult:
    """One experiment's outcome: our figure beside the seed's, and whether the claimed
    direction holds here."""

    name: str
    claim: str  # the seed's claim, in our words
    seed_figure: str  # the seed author's number(s), as stated there
    our_figure: str  # ours, in the same shape
    direction: str  # what "the claim holds" means here, in words
    holds: bool  # the direction holds in this run
    scale: float
    metrics: dict[str, Any] = field(default_factory=dict)  # every number behind the figures
    notes: list[str] = field(default_factory=list)  # definitions and caveats of this run
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)  # scenarios, for --out
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "claim": self.claim, "seed_figure": self.seed_figure,
            "our_figure": self.our_figure, "direction": self.direction, "holds": self.holds,
            "scale": self.scale, "wall_s": self.wall_s, "notes": list(self.notes),
            "metrics": self.metrics,
        }


RunFn = Callable[[float, int], ExperimentResult]


@dataclass(frozen=True, slots=True)
class Experiment:
    """A named, rerunnable experiment: `run(scale, jobs)` returns its result."""

    name: str
    claim: str
    seed_figure: str
    run_fn: RunFn

    def run(self, scale: float = 1.0, jobs: int = 1) -> ExperimentResult:
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        t0 = time.perf_counter()
        res = self.run_fn(scale, jobs)
        res.wall_s = time.perf_counter() - t0
        return res


def parallel_map(fn: Callable[..., T], args: Sequence[tuple[Any, ...]], jobs: int) -> list[T]:
    """[fn(*a) for a in args], in worker processes when jobs > 1 (order kept)."""
    if jobs <= 1 or len(args) <= 1:
        return [fn(*a) for a in args]
    with ProcessPoolExecutor(max_workers=min(jobs, len(args))) as pool:
        futures = [pool.submit(fn, *a) for a in args]
        return [f.result() for f in futures]


# Load is offered tokens/s over the pool's measured capacity: triage/sim/capacity.py
# (shared with the scenarios' `load:`), re-exported here for the experiments.


def summarize(r: SimResult) -> dict[str, Any]:
    """The figures every experiment reports about one run (fractions of all requests)."""
    o = r.overall
    n = o["requests"] or 1
    met = o["sla_met"] / n
    accepted = o["acceptance"] or 0.0
    pool = next(iter(r.pools))
    return {
        "policy": r.policy,
        "requests": o["requests"],
        "sla_violations": 1.0 - met,  # refused, timed out, failed or late
        "acceptance": accepted,
        "refused": o["rejected"] / n,
        "timed_out": o["timed_out"] / n,
        "late": accepted - met,  # admitted, then missed its SLA
        "latency_p99_s": o["latency_s"]["p99"],
        "gpu_busy": o["gpu_utilization"],
        "kv_used": series_mean(r.series.gauge(f"kv_used:{pool}")),
        "kv_reserved": series_mean(r.series.gauge(f"kv_reserved:{pool}")),
        "preemption_rate": o["preemption_rate"],
        "rejected_by_reason": o["rejected_by_reason"],
    }


def run_summary(sc: Scenario, policy: str) -> dict[str, Any]:
    """summarize(run_policy(sc, policy)): module-level, so parallel_map can pickle it."""
    return summarize(run_policy(sc, policy))


# Seeds of the shared-pool experiments: a full-size run averages three, a scaled-down
# one uses fewer (CI: the first), so a figure is never one lucky draw.
SEEDS = (5, 1, 2)


def seeds_for(scale: float) -> tuple[int, ...]:
    return SEEDS[: max(1, min(len(SEEDS), round(len(SEEDS) * scale)))]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def average_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of each numeric field over seeds (others from the first), plus `by_seed`:
    every numeric field's values, seed by seed."""
    out = dict(rows[0])
    by_seed: dict[str, list[Any]] = {}
    for k, v in rows[0].items():
        vals = [r.get(k) for r in rows]
        if _number(v) and all(_number(x) for x in vals):
            nums = [float(x) for x in vals if x is not None]
            out[k] = sum(nums) / len(nums)
            by_seed[k] = nums
    out["seeds"] = len(rows)
    out["by_seed"] = by_seed
    return out


def run_grid(
    specs: dict[str, dict[int, dict[str, Any]]], policies: Sequence[str],
    measure: Callable[[Scenario, str], dict[str, Any]], jobs: int,
) -> dict[str, dict[str, dict[str, Any]]]:
    """measure(scenario, policy) for every variant x seed x policy of `specs`
    ({variant: {seed: scenario spec}}), averaged over seeds: {variant: {policy: row}}."""
    keys = [(v, seed, p) for v, by_seed in specs.items() for seed in by_seed for p in policies]
    rows = parallel_map(
        measure, [(scenario_from_dict(specs[v][seed]), p) for v, seed, p in keys], jobs
    )
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {v: {} for v in specs}
    for (v, _seed, p), row in zip(keys, rows, strict=True):
        grouped[v].setdefault(p, []).append(row)
    return {v: {p: average_rows(rs) for p, rs in by_p.items()} for v, by_p in grouped.items()}


def series_mean(values: list[float]) -> float | None:
    xs = [v for v in values if v == v]  # NaN: no reading in that slot
    return sum(xs) / len(xs) if xs else None


def pct(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{100.0 * v:.{digits}f}%"
