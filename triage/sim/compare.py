"""One scenario under several policies: same seed, same arrivals, results as data.

This is the function experiments script against::

    from triage.sim.compare import compare
    from triage.sim.scenario import load_scenario

    cmp = compare(load_scenario("seed-morning").scaled(0.2), ["full", "admit_all"])
    cmp.metric("sla_attainment")            # {"full": 0.93, "admit_all": 0.41}
    cmp["full"].tenants["rag"]["latency_s"]["p99"]

Runs are independent (each rebuilds the arrival stream from the scenario's seed),
so they may run in worker processes (`jobs`), and results do not depend on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from triage.config.models import PolicyConfig
from triage.sim.capacity import with_offered_load
from triage.sim.engine import Simulator
from triage.sim.policies import policy_config
from triage.sim.result import SimResult
from triage.sim.scenario import Scenario

log = logging.getLogger(__name__)

PolicyLike = str | PolicyConfig
# (policy name, fraction of the arrival window done, 0..1; may pass 1 before the drain ends)
CompareProgress = Callable[[str, float], None]

HEADLINE = (
    "sla_attainment", "sla_attainment_weighted", "sla_attainment_completed",
    "goodput_tokens_per_gpu_s", "acceptance", "timeout_rate", "preemption_rate",
    "gpu_utilization", "fairness_jain_backlogged", "fairness_jain", "fairness_max_gap",
)


def offered_load(r: SimResult) -> float | None:
    """Offered tokens/s over the pool's measured capacity, where the run carries it
    (`SimResult.offered_load`, or `overall["offered_load"]`); None where unknown."""
    v = getattr(r, "offered_load", None)
    if v is None:
        v = r.overall.get("offered_load")
    return float(v) if v is not None else None


def resolve(scenario: Scenario, policy: PolicyLike) -> tuple[str, PolicyConfig]:
    """(display name, PolicyConfig) for a variant name or an explicit PolicyConfig."""
    if isinstance(policy, PolicyConfig):
        return policy.name, policy
    return policy, policy_config(policy, scenario.config.policy, scenario.policy_variants)


def run_policy(
    scenario: Scenario, policy: PolicyLike, *, progress: CompareProgress | None = None
) -> SimResult:
    """Simulate `scenario` under one policy (at its `load`, if it asks for one)."""
    scenario = with_offered_load(scenario)
    name, pc = resolve(scenario, policy)
    duration = scenario.expected_duration()

    def tick(now: float, _arrivals: int) -> None:
        if progress is not None and duration:
            progress(name, min(1.0, now / duration))

    log.info("simulating %s under %s", scenario.name, name)
    invalid: dict[str, dict[str, int]] = {}
    r = Simulator(
        scenario.config, scenario.arrivals(invalid), policy=pc, options=scenario.options(),
        scenario=scenario.name, policy_name=name, progress=tick if progress else None,
    ).run()
    r.offered_load = scenario.offered_load
    r.capacity_tokens_per_s = scenario.capacity_tokens_per_s
    r.invalid = invalid
    return r


@dataclass(slots=True)
class Comparison:
    """Results of one scenario under several policies, in the order asked."""

    scenario: Scenario
    results: dict[str, SimResult] = field(default_factory=dict)

    def __getitem__(self, policy: str) -> SimResult:
        return self.results[policy]

    @property
    def policies(self) -> list[str]:
        return list(self.results)

    def metric(self, name: str, tenant: str | None = None) -> dict[str, Any]:
        """One summary figure per policy (overall, or of one tenant)."""
        return {
            p: (r.tenants[tenant] if tenant else r.overall).get(name)
            for p, r in self.results.items()
        }

    def table(self) -> list[dict[str, Any]]:
        """Headline rows, one per policy (what the report's first table shows)."""
        rows = []
        for p, r in self.results.items():
            o = r.overall
            rows.append({
                "policy": p, **{k: o.get(k) for k in HEADLINE},
                "latency_p50_s": o["latency_s"]["p50"], "latency_p99_s": o["latency_s"]["p99"],
                "queue_wait_p99_s": o["queue_wait_s"]["p99"],
                "predictor_error_p50": o["predictor_error"]["p50"],
                "predictor_error_p95": o["predictor_error"]["p95"],
                "predictor_error_p99": o["predictor_error"]["p99"],
                "offered_load": offered_load(r),
                "tenant_sla_attainment": {t: m["sla_attainment"] for t, m in r.tenants.items()},
                "recompute_tokens": o["recompute_tokens_core"] + o["recompute_tokens_engine"],
                "requests": o["requests"], "wall_s": r.wall_s,
            })
        return rows

    def to_dict(self) -> dict[str, Any]:
        s = self.scenario
        return {
            "scenario": {
                "name": s.name, "description": s.description, "seed": s.seed,
                "duration_s": s.duration_s, "gpu_noise": s.gpu_noise,
                "load": s.load, "offered_load": s.offered_load,
                "capacity_tokens_per_s": s.capacity_tokens_per_s, "rate_scale": s.rate_scale,
                "gpus": len(s.config.all_gpus()),
                "tenants": {
                    t.name: {"weight": t.weight, "sla_ms": t.sla_ms,
                             "rate_tokens_per_s": t.rate_tokens_per_s}
                    for t in s.config.tenants
                },
            },
            "policies": self.policies,
            "table": self.table(),
            "results": {p: r.to_dict() for p, r in self.results.items()},
        }


def _run_one(scenario: Scenario, policy: PolicyLike) -> SimResult:
    return run_policy(scenario, policy)


def compare(
    scenario: Scenario, policies: Sequence[PolicyLike] | None = None, *,
    progress: CompareProgress | None = None, jobs: int = 1, measure_load: bool = False,
) -> Comparison:
    """Run `scenario` under each policy (default: the scenario's list), at its `load`
    if it asks for one; `measure_load` reports the offered load of one that does not."""
    scenario = with_offered_load(scenario, measure=measure_load)  # once, for every run
    chosen: Sequence[PolicyLike] = policies if policies is not None else scenario.policies
    names = [resolve(scenario, p)[0] for p in chosen]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names repeat: {names}")
    out = Comparison(scenario)
    if jobs <= 1 or len(chosen) <= 1:
        for p in chosen:
            r = run_policy(scenario, p, progress=progress)
            out.results[r.policy] = r
        return out
    with ProcessPoolExecutor(max_workers=min(jobs, len(chosen))) as pool:
        futures = [pool.submit(_run_one, scenario, p) for p in chosen]
        done = {}
        for name, fut in zip(names, futures, strict=True):
            done[name] = fut.result()
            if progress is not None:
                progress(name, 1.0)
    out.results = {n: done[n] for n in names}
    return out
