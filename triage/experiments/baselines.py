"""Issue 9's bar as an experiment: the full policy against every baseline users would
pick instead, on every shipped scenario and at three measured loads.

For each case the full policy should be at or above the best baseline on SLA
attainment (all arrivals; refusals count as misses), weight-normalized attainment and
goodput; no tight-SLA tenant (the case's tightest SLA) more than 1 point worse under
full than under any baseline; and full's goodput within 5% of the clairvoyant
reference (the full policy told each request's true output and service time). A case
passes when all of these hold. A full-size run judges every case at the scenario's own
seed and at two more (EXTRA_SEEDS); the experiment holds when every case passes at
every seed. `triage experiments baselines --check` exits 1 otherwise; docs/experiments.md gives
today's table and what still fails.
"""

from __future__ import annotations

from typing import Any

from triage.experiments.base import Experiment, ExperimentResult, parallel_map, pct
from triage.sim.capacity import with_offered_load
from triage.sim.compare import run_policy
from triage.sim.scenario import Scenario, load_scenario

NAME = "baselines"
CLAIM = "the full policy is at or above every baseline everywhere (issue 9's bar)"
SEED_FIGURE = "n/a (the seed compares against no front door only)"
BASELINES = (
    "admit_all", "reject_only", "rate_limit_only", "bounded_queue", "vtc", "edf",
    "engine_queue_cap", "tpm_priority",
)
REFERENCE = "clairvoyant"
CASES = (
    "seed-morning", "multi-model", "adversarial", "azure-trace",
    *(f"{name}@{pct_}" for name in ("tenants13", "long-context", "two-services")
      for pct_ in (85, 100, 120)),
)
TENANT_SLACK = 0.01  # a tight-SLA tenant may be this much worse under full
GOODPUT_SLACK = 0.05  # full's goodput within this of the clairvoyant reference's
# Seeds a full-size run also judges every case at, beside the scenario's own: the GPUs'
# timing noise is one draw per batch change, so any change in decisions reshuffles it,
# and a gap of hundredths at one seed can be that draw (docs/experiments.md).
EXTRA_SEEDS = (101, 102)


def case_scenario(case: str, scale: float) -> Scenario:
    sc = with_offered_load(load_scenario(case), measure=False)
    return sc.scaled(scale) if scale != 1.0 else sc


def measure(sc: Scenario, policy: str) -> dict[str, Any]:
    r = run_policy(sc, policy)
    o = r.overall
    weights = {t.name: t.weight for t in sc.config.tenants}
    tenants = {t: m["sla_attainment"] for t, m in r.tenants.items() if m["requests"]}
    wsum = sum(weights[t] for t in tenants)
    return {
        "sla": o["sla_attainment"], "goodput": o["goodput_tokens_per_gpu_s"],
        "weighted": sum(weights[t] * v for t, v in tenants.items()) / wsum if wsum else 0.0,
        "tenants": tenants,
    }


def judge(sc: Scenario, rows: dict[str, dict[str, Any]]) -> list[str]:
    """What fails the bar in one case (empty: it passes)."""
    return [message for message, _gap in shortfalls(sc, rows)]


def shortfalls(sc: Scenario, rows: dict[str, dict[str, Any]]) -> list[tuple[str, float]]:
    """Each check of the bar that `rows["full"]` fails, with how far it is short: in points
    for SLA, weighted SLA and tight tenants (past their 1-point slack), in percent of the
    bar for goodput. Empty: the case passes."""
    full = rows["full"]
    base = {b: rows[b] for b in BASELINES}
    misses: list[tuple[str, float]] = []
    for key, label in (("sla", "SLA"), ("weighted", "weighted SLA"), ("goodput", "goodput")):
        best = max(base, key=lambda b: base[b][key])
        bar = base[best][key]
        if full[key] < bar - 1e-9:
            misses.append((f"{label} {full[key]:.4g} < {best} {bar:.4g}",
                           _gap(full, base[best], key)))
    for t in _tight_tenants(sc, full):
        best = max(base, key=lambda b: base[b]["tenants"].get(t, 0.0))
        gap = _gap(full, base[best], t)
        if gap > 0.0:
            misses.append((f"tight tenant {t} {pct(full['tenants'][t])} < {best} "
                           f"{pct(base[best]['tenants'][t])}", gap))
    ref = rows[REFERENCE]["goodput"]
    if full["goodput"] < (1.0 - GOODPUT_SLACK) * ref:
        gap = ((1.0 - GOODPUT_SLACK) * ref - full["goodput"]) / ref
        misses.append((f"goodput {full['goodput']:.0f} below 95% of clairvoyant {ref:.0f}",
                       100.0 * gap))
    return misses


def steady_gaps(sc: Scenario, seeded: list[dict[str, dict[str, Any]]]) -> list[str]:
    """The figures on which full is behind one baseline at every seed of `seeded` (one
    case's rows per seed), worst first, with the mean gap: points for SLA, weighted SLA
    and tight tenants (past their 1-point slack), percent for goodput. Gaps that change
    sign with the seed are the GPUs' noise; these are not."""
    tights = _tight_tenants(sc, seeded[0]["full"])
    found: list[tuple[float, str]] = []
    for b in BASELINES:
        for key in ("sla", "weighted", "goodput", *tights):
            gaps = [_gap(rows["full"], rows[b], key) for rows in seeded]
            if all(g > 0.0 for g in gaps):
                mean = sum(gaps) / len(gaps)
                label = {"sla": "SLA", "weighted": "weighted SLA", "goodput": "goodput"}.get(
                    key, f"tenant {key}")
                unit = "%" if key == "goodput" else " pt"
                found.append((mean, f"{label} {mean:.2f}{unit} behind {b}"))
    return [text for _mean, text in sorted(found, reverse=True)]


def _tight_tenants(sc: Scenario, full: dict[str, Any]) -> list[str]:
    """The tenants with the case's tightest SLA among those that sent requests."""
    sent = full["tenants"]
    tight = min(t.sla_ms for t in sc.config.tenants if t.name in sent)
    return [t.name for t in sc.config.tenants if t.sla_ms == tight and t.name in sent]


def _gap(full: dict[str, Any], base: dict[str, Any], key: str) -> float:
    """How far full is behind `base` on one figure (negative: ahead), in the bar's units:
    points for SLA and weighted SLA, percent of `base` for goodput, points past the
    1-point slack for a tenant (`key` a tenant's name)."""
    if key in ("sla", "weighted", "goodput"):
        b, f = float(base[key]), float(full[key])
        if key != "goodput":
            return 100.0 * (b - f)
        return 100.0 * (b - f) / b if b else 0.0
    mine = float(full["tenants"][key])
    return 100.0 * (float(base["tenants"].get(key, 0.0)) - TENANT_SLACK - mine)


def clears_against_all(sc: Scenario, rows: dict[str, dict[str, Any]]) -> list[str]:
    """The policies (full and each baseline) that clear the bar of one case when every
    other one of them is the competition: a baseline is judged in full's seat, with full
    in its own. The bar is the best of eight policies on each figure at once; where no
    policy clears it, it asks for more than any of them does."""
    policies = ("full", *BASELINES)
    clear = []
    for cand in policies:
        seats = dict(rows)
        if cand != "full":
            seats[cand], seats["full"] = rows["full"], rows[cand]
        if not shortfalls(sc, seats):
            clear.append(cand)
    return clear


def run(scale: float, jobs: int, cases: tuple[str, ...] = CASES,
        seeds: tuple[int | None, ...] | None = None) -> ExperimentResult:
    """Every case at the scenario's own seed (None) and, at full size, at EXTRA_SEEDS too:
    a verdict that flips with the seed was a lucky draw, not a result."""
    if seeds is None:
        seeds = (None, *EXTRA_SEEDS) if scale >= 1.0 else (None,)
    policies = ("full", *BASELINES, REFERENCE)
    scenarios = {(c, s): _at_seed(case_scenario(c, scale), s) for c in cases for s in seeds}
    keys = [(c, s, p) for c in cases for s in seeds for p in policies]
    rows = parallel_map(measure, [(scenarios[c, s], p) for c, s, p in keys], jobs)
    by_seed: dict[int | None, dict[str, dict[str, dict[str, Any]]]] = {
        s: {c: {} for c in cases} for s in seeds}
    for (c, s, p), row in zip(keys, rows, strict=True):
        by_seed[s][c][p] = row
    by = by_seed[seeds[0]]
    failures = {c: judge(scenarios[c, seeds[0]], by[c]) for c in cases}
    passing = [c for c in cases if not failures[c]]
    seed_passes = {c: [s for s in seeds if not judge(scenarios[c, s], by_seed[s][c])]
                   for c in cases}
    robust = [c for c in cases if len(seed_passes[c]) == len(seeds)]
    steady = {c: steady_gaps(scenarios[c, seeds[0]], [by_seed[s][c] for s in seeds])
              for c in cases} if len(seeds) > 1 else {}
    clear = {c: clears_against_all(scenarios[c, seeds[0]], by[c]) for c in cases}
    counts = {p: [c for c in cases if p in clear[c]] for p in ("full", *BASELINES)}
    envelope = [c for c in cases if not clear[c]]
    ours = f"{len(passing)} of {len(cases)} cases pass" + (
        "; failing: " + ", ".join(c for c in cases if failures[c]) if len(passing) < len(cases)
        else ""
    )
    if len(seeds) > 1:
        ours += f"; {len(robust)} pass at all {len(seeds)} seeds"

    def seed_note(c: str) -> str:
        if len(seeds) == 1:
            return ""
        names = ", ".join(_seed_label(s) for s in seed_passes[c]) or "none"
        behind = "; behind at every seed: " + ", ".join(steady[c][:3]) if steady[c] else ""
        return f" (passes at {len(seed_passes[c])} of {len(seeds)} seeds: {names}{behind})"

    return ExperimentResult(
        name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, our_figure=ours,
        direction="every case passes at every seed (SLA, weighted SLA and goodput >= the "
        "best baseline; tight tenants within 1 point; goodput within 5% of clairvoyant)",
        holds=len(robust) == len(cases), scale=scale,
        notes=[*(f"{c}: " + ("; ".join(failures[c]) or "passes") + seed_note(c)
                 for c in cases),
               "cases each policy clears against all the others: " + ", ".join(
                   f"{p} {len(cs)}" for p, cs in counts.items()),
               "cleared by no policy: " + (", ".join(envelope) or "none")],
        metrics={"passing": passing, "failures": failures, "runs": by,
                 "seeds": [_seed_label(s) for s in seeds],
                 "passing_at_every_seed": robust,
                 "passing_seeds": {c: [_seed_label(s) for s in v]
                                   for c, v in seed_passes.items()},
                 "runs_by_seed": {_seed_label(s): v for s, v in by_seed.items()},
                 "behind_at_every_seed": steady,
                 "clears_against_all": counts, "cleared_by_none": envelope},
    )


def _at_seed(sc: Scenario, seed: int | None) -> Scenario:
    return sc if seed is None else sc.with_seed(seed)


def _seed_label(seed: int | None) -> str:
    return "shipped" if seed is None else str(seed)


EXPERIMENT = Experiment(name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, run_fn=run)
