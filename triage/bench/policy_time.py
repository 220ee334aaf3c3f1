"""`triage bench policies`: what each policy costs to simulate on one scenario.

Issue 9 asks that the full policy on the 13-tenant scenario run within 1.5x of
`admit_all`'s time: a policy that is too slow to simulate cannot be judged on many
cases and seeds. Each policy's run is timed in process CPU seconds (not wall time,
which this VM's neighbours move), interleaved over the repetitions, and the fastest
repetition of each is reported beside its ratio to the first policy's. The scenario's
capacity (what its load means) is measured once before any timing.
"""

from __future__ import annotations

import time
from typing import Any

from triage.experiments.baselines import case_scenario
from triage.sim.compare import resolve, run_policy


def run(scenario: str, policies: list[str], *, repetitions: int = 2,
        scale: float = 1.0) -> dict[str, Any]:
    """CPU seconds per policy (best of `repetitions`) and the ratio to `policies[0]`."""
    sc = case_scenario(scenario, scale)
    for policy in policies:
        resolve(sc, policy)  # an unknown name fails here, before minutes of runs
    times: dict[str, list[float]] = {p: [] for p in policies}
    requests: dict[str, int] = {}
    for _ in range(repetitions):
        for policy in policies:
            started = time.process_time()
            result = run_policy(sc, policy)
            times[policy].append(time.process_time() - started)
            requests[policy] = int(result.overall["requests"])
    base = min(times[policies[0]])
    return {
        "scenario": sc.name,
        "repetitions": repetitions,
        "policies": {
            p: {"cpu_s": min(t), "cpu_s_all": t, "ratio": min(t) / base if base else 0.0,
                "requests": requests[p]}
            for p, t in times.items()
        },
    }
