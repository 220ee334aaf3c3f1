"""The seed article's claims as experiments anyone can rerun (docs/experiments.md).

Each module turns one claim into a scenario, the policies it compares, the quantity
it measures and the direction the claim implies; every policy is the real
admission core with flags (triage.sim.policies), driven by the simulator::

    from triage.experiments import EXPERIMENTS

    res = EXPERIMENTS["queue"].run(scale=0.1)
    res.our_figure, res.seed_figure, res.holds

`triage experiments` runs them from the command line; CI runs them at a tenth of
their size and asserts each direction (tests/unit/test_experiments.py).
"""

from __future__ import annotations

from triage.experiments import (
    baselines,
    borrowing,
    buffer,
    degradation,
    frontier,
    preemption,
    queueing,
    recipe,
)
from triage.experiments.base import Experiment, ExperimentResult

EXPERIMENTS: dict[str, Experiment] = {
    m.EXPERIMENT.name: m.EXPERIMENT
    for m in (queueing, degradation, borrowing, buffer, preemption, recipe, baselines, frontier)
}

__all__ = ["EXPERIMENTS", "Experiment", "ExperimentResult"]
