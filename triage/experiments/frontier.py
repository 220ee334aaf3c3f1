"""Can any policy this core expresses clear issue 9's bar where the full policy does not?

`baselines` asks whether the full policy is at or above every baseline. Where it is not,
the next question is whether a setting would fix it or a new mechanism is needed. This
experiment answers it by search: a grid of policy strings (the full policy, the
clairvoyant reference, EDF and VTC with the full policy's quota and SLA check; each with
and without the queue, hysteresis and the adaptive buffer; eight knobs of the full
policy), each judged against the same baselines with the same bar (`baselines.judge`).
For each case it reports how many strings pass and the nearest miss: the string whose
largest shortfall is smallest. A case no string clears, clairvoyant included, is out of
reach of settings; docs/experiments.md records the run.
"""

from __future__ import annotations

import itertools
from typing import Any

from triage.experiments import baselines as bar
from triage.experiments.base import Experiment, ExperimentResult, parallel_map

NAME = "frontier"
CLAIM = "some policy string clears issue 9's bar in every case the full policy misses"
SEED_FIGURE = "n/a (a search over this core's settings)"
# The cases the full policy misses on the 2026-12-05 run (docs/experiments.md).
CASES = (
    "seed-morning", "multi-model", "tenants13@85", "tenants13@100", "tenants13@120",
    "long-context@85", "long-context@120",
)
_WITH_CHECKS = "+quota=true+borrowing=true+overage_when_idle=true+sla_fit=true"
_KNOBS = (
    "+order=deadline", "+tight_sla_ratio=0", "+fair_share_tolerance=0.5",
    "+tight_share_tolerance=0.1", "+tight_share_tolerance=3", "+deadline_s_per_token=0",
    "+deadline_s_per_token=3e-5", "+backfill_s=5",
)


def grid() -> tuple[str, ...]:
    """The policy strings searched: 48, the full policy first."""
    out: list[str] = []
    for head in ("full", "clairvoyant", f"edf{_WITH_CHECKS}", f"vtc{_WITH_CHECKS}"):
        for queue, hyst, buf in itertools.product(
            ("", "+queue=false"), ("", "+hysteresis=false"), ("", "+variance_buffer=1.0")
        ):
            out.append(head + queue + hyst + buf)
    for knob in _KNOBS:
        out += ["full" + knob, "full+queue=false" + knob]
    return tuple(dict.fromkeys(out))


def nearest(rows: dict[str, list[tuple[str, float]]]) -> tuple[str, float]:
    """The string whose largest shortfall is smallest, and that shortfall (0: it passes)."""
    worst = {v: max((gap for _m, gap in misses), default=0.0) for v, misses in rows.items()}
    best = min(worst, key=lambda v: worst[v])
    return best, worst[best]


def run(scale: float, jobs: int, cases: tuple[str, ...] = CASES) -> ExperimentResult:
    scenarios = {c: bar.case_scenario(c, scale) for c in cases}
    variants = grid()
    fixed = (*bar.BASELINES, bar.REFERENCE)
    keys = [(c, p) for c in cases for p in (*fixed, *variants)]
    measured = parallel_map(bar.measure, [(scenarios[c], p) for c, p in keys], jobs)
    runs: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in cases}
    for (c, p), row in zip(keys, measured, strict=True):
        runs[c][p] = row
    verdicts: dict[str, dict[str, list[tuple[str, float]]]] = {}
    for c in cases:
        base = {p: runs[c][p] for p in fixed}
        verdicts[c] = {v: bar.shortfalls(scenarios[c], {**base, "full": runs[c][v]})
                       for v in variants}
    summary: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for c in cases:
        passing = [v for v, misses in verdicts[c].items() if not misses]
        near, gap = nearest(verdicts[c])
        summary[c] = {"passing": passing, "nearest": near, "nearest_gap": gap,
                      "nearest_misses": [m for m, _g in verdicts[c][near]]}
        row = runs[c][near]
        notes.append(
            f"{c}: {len(passing)} of {len(variants)} strings pass; nearest {near} "
            f"({100 * row['sla']:.2f} / {100 * row['weighted']:.2f} / {row['goodput']:.0f}; "
            f"largest shortfall {gap:.2f}" + (": " + "; ".join(summary[c]["nearest_misses"])
                                            if gap > 0 else "") + ")"
        )
    reachable = [c for c in cases if summary[c]["passing"]]
    return ExperimentResult(
        name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE,
        our_figure=f"{len(reachable)} of {len(cases)} cases reachable by some string",
        direction="every case has a policy string that clears the bar",
        holds=len(reachable) == len(cases), scale=scale, notes=notes,
        metrics={"grid": list(variants), "cases": summary,
                 "runs": {c: {p: {k: r[k] for k in ("sla", "weighted", "goodput")}
                              for p, r in runs[c].items()} for c in cases}},
    )


EXPERIMENT = Experiment(name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, run_fn=run)
