"""The result of one simulated run, as data: what compare, the report, the CLI's
--json and later experiments consume. Summaries are plain dicts of numbers (JSON
as they are); histograms and series stay objects for the plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from triage.sim.fairshare import fairness_detail
from triage.sim.histogram import LogHistogram
from triage.sim.metrics import combine, weighted_sla
from triage.sim.series import TimeSeries

if TYPE_CHECKING:
    from triage.sim.engine import Simulator


@dataclass(slots=True, kw_only=True)
class SimResult:
    """Everything measured in one run of one policy."""

    scenario: str
    policy: str
    seed: int
    gpus: int  # GPUs in the run
    makespan_s: float  # virtual time of the last event (the drain included)
    wall_s: float  # wall-clock seconds the run took
    arrivals: int
    decisions: int  # decisions the core made
    conserved: bool  # every request ended in exactly one terminal outcome
    overall: dict[str, Any]  # TenantStats.summary of all tenants + run-wide figures
    tenants: dict[str, dict[str, Any]]  # per tenant summary
    pools: dict[str, dict[str, Any]]  # per pool: utilization, thresholds, core counters
    series: TimeSeries
    latency: dict[str, LogHistogram] = field(default_factory=dict)  # tenant (and "all")
    wait: dict[str, LogHistogram] = field(default_factory=dict)
    # offered tokens/s over the pool's measured capacity (triage/sim/capacity.py); None
    # where it was not measured. GPU busy time reads ~99% at any load: this is the load.
    offered_load: float | None = None
    capacity_tokens_per_s: float | None = None
    # requests the live app would refuse as invalid before admission ({tenant: {reason:
    # n}}, e.g. context_overflow): not simulated, not in `arrivals`
    invalid: dict[str, dict[str, int]] = field(default_factory=dict)
    predictor_error: dict[str, LogHistogram] = field(default_factory=dict)  # actual / predicted
    retry_hint: dict[str, LogHistogram] = field(default_factory=dict)  # refusals' retry_after_s

    @property
    def requests_per_wall_s(self) -> float:
        return self.arrivals / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self, *, series: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scenario": self.scenario, "policy": self.policy, "seed": self.seed,
            "gpus": self.gpus, "makespan_s": self.makespan_s, "wall_s": self.wall_s,
            "arrivals": self.arrivals, "decisions": self.decisions,
            "conserved": self.conserved, "offered_load": self.offered_load,
            "capacity_tokens_per_s": self.capacity_tokens_per_s, "invalid": self.invalid,
            "overall": self.overall, "tenants": self.tenants, "pools": self.pools,
        }
        if series:
            out["series"] = self.series.to_dict()
        return out


def build_result(sim: Simulator, *, wall_s: float) -> SimResult:
    """Summarize a finished Simulator."""
    makespan = sim.now
    ngpus = len(sim.gpus)
    gpu_s = ngpus * makespan
    stats = list(sim.tenants.values())
    total = combine(stats, sim.series)
    conserved = all(s.requests == s.terminal for s in stats) and sim.live_requests == 0
    tenants = {s.name: s.summary(gpu_s) for s in stats}
    overall = total.summary(gpu_s)
    fair = fairness_detail(
        sim.series, {s.name: s.weight for s in stats},
        {t.name: t.rate_tokens_per_s for t in sim.config.tenants},
    )
    busy_total = 0.0
    pools: dict[str, dict[str, Any]] = {}
    h = sim.config.hysteresis
    for name, d in sim.core.dispatchers.items():
        gs = [g for g in sim.gpus if g.pool == name]
        busy = sum(g.engine.busy_seconds for g in gs)
        busy_total += busy
        st = d.stats
        pools[name] = {
            "gpus": len(gs),
            "gpu_utilization": busy / (len(gs) * makespan) if gs and makespan > 0 else 0.0,
            "hysteresis_low": h.low, "hysteresis_high": h.high,
            "autoscale_above": h.high + h.autoscale_margin,
            "dispatched": st.dispatched, "queued": st.queued, "rejected": st.rejected,
            "timed_out": st.timed_out, "completed": st.completed, "failed": st.failed,
            "core_preemptions": st.preemptions, "core_recompute_tokens": st.recompute_tokens,
            "engine_preemptions": sum(g.engine.engine_preemptions for g in gs),
            "engine_recompute_tokens": sum(g.engine.recomputed_tokens for g in gs),
            "hysteresis_flips": len(d.monitor.flips),
            "variance_buffer": sim.core.predictor.variance_buffer,
        }
    overall.update({
        "gpu_utilization": busy_total / gpu_s if gpu_s > 0 else 0.0,
        "sla_attainment_weighted": weighted_sla(stats),
        "fairness_jain": fair.jain,
        "fairness_jain_backlogged": fair.jain_backlogged,
        "fairness_max_gap": fair.gap,
        "fair_share_ratio": fair.ratios,
        "fair_share_ratio_backlogged": fair.ratios_backlogged,
        "backlogged_tenants": fair.backlogged,
    })
    return SimResult(
        scenario=sim.scenario, policy=sim.policy_name, seed=sim.options.seed, gpus=ngpus,
        makespan_s=makespan, wall_s=wall_s, arrivals=sim.arrivals, decisions=sim.decisions,
        conserved=conserved, overall=overall, tenants=tenants, pools=pools, series=sim.series,
        latency={**{s.name: s.latency for s in stats}, "all": total.latency},
        wait={**{s.name: s.wait for s in stats}, "all": total.wait},
        predictor_error={**{s.name: s.pred_error for s in stats}, "all": total.pred_error},
        retry_hint={**{s.name: s.retry_hint for s in stats}, "all": total.retry_hint},
    )
