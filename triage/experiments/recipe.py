"""The full policy against the seed's own recipe, on the shipped scenarios.

The seed's recipe, as far as policy flags can express it: the same five checks,
a variance buffer fixed at 1.3, and a queue that stops at a blocked head (its
dequeue puts the head back and returns): `lookahead=1, backfill_s=0`. What `full`
does differently and flags can switch: a per-model buffer learned from the
predictor's own error (capped at 1.6), and a dispatch pass that may try up to 8
tenants past a blocked head for 0.5 s and holds the line only for a head short of
KV. (What flags cannot switch, both keep: output ratios learned per tenant instead
of the seed's fixed 0.7, pressure-weighted fairness, preemption only for KV.)

To see which difference does what, the two are crossed: full, the seed recipe,
full with the fixed buffer, full with the stopping queue.
"""

from __future__ import annotations

from typing import Any

from triage.experiments.base import (
    Experiment,
    ExperimentResult,
    parallel_map,
    pct,
    summarize,
)
from triage.sim.compare import run_policy
from triage.sim.scenario import Scenario, load_scenario

NAME = "recipe"
CLAIM = "where the full policy does better than the seed's recipe (fixed 1.3 buffer, a " \
    "queue that stops at a blocked head)"
SEED_FIGURE = "n/a (the seed's recipe is the baseline)"
SCENARIOS = ("seed-morning", "adversarial", "multi-model")
FULL = "full"
SEED = ("full+variance_buffer=1.3+lookahead=1+backfill_s=0+lane_lookahead=1"
        "+overage_when_idle=false")
FIXED = "full+variance_buffer=1.3"
STOPPING = "full+lookahead=1+backfill_s=0+lane_lookahead=1"
POLICIES = (FULL, SEED, FIXED, STOPPING)
LABELS = {FULL: "full", SEED: "seed recipe", FIXED: "full, buffer 1.3",
          STOPPING: "full, stopping queue"}


def measure(sc: Scenario, policy: str) -> dict[str, Any]:
    r = run_policy(sc, policy)
    row = summarize(r)
    tenants = {t: m["sla_attainment"] for t, m in r.tenants.items() if m["requests"]}
    worst = min(tenants, key=lambda t: tenants[t]) if tenants else None
    row.update({
        "goodput_tokens_per_gpu_s": r.overall["goodput_tokens_per_gpu_s"],
        "fairness_jain": r.overall["fairness_jain"],
        "tenant_sla_attainment": tenants,
        "worst_tenant": worst,
    })
    return row


def run(scale: float, jobs: int) -> ExperimentResult:
    scenarios = {name: load_scenario(name).scaled(scale) for name in SCENARIOS}
    keys = [(s, p) for s in SCENARIOS for p in POLICIES]
    rows = parallel_map(measure, [(scenarios[s], p) for s, p in keys], jobs)
    by: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in SCENARIOS}
    for (s, p), row in zip(keys, rows, strict=True):
        by[s][LABELS[p]] = row

    def v(s: str, p: str) -> float:
        return float(by[s][LABELS[p]]["sla_violations"])

    wins = [s for s in SCENARIOS if v(s, FULL) < v(s, SEED) - 1e-9]
    losses = [s for s in SCENARIOS if v(s, FULL) > v(s, SEED) + 1e-9]
    ours = "; ".join(f"{s}: {pct(v(s, FULL))} vs {pct(v(s, SEED))}" for s in SCENARIOS)
    notes = [
        "SLA violations (refused, timed out or late), full vs seed recipe: " + ours,
        "late admissions, full vs seed recipe: " + "; ".join(
            f"{s} {pct(by[s]['full']['late'], 2)} vs {pct(by[s]['seed recipe']['late'], 2)}"
            for s in SCENARIOS
        ),
        "one difference at a time (full, buffer 1.3 / full, stopping queue): " + "; ".join(
            f"{s} {pct(v(s, FIXED))} / {pct(v(s, STOPPING))}" for s in SCENARIOS
        ),
    ]
    return ExperimentResult(
        name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, our_figure=ours,
        direction="full has fewer SLA violations than the seed recipe on at least one "
        "shipped scenario",
        holds=bool(wins), scale=scale, notes=notes,
        metrics={
            "policies": {LABELS[p]: p for p in POLICIES}, "full_better": wins,
            "seed_recipe_better": losses, "runs": by,
        },
    )


EXPERIMENT = Experiment(name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, run_fn=run)
