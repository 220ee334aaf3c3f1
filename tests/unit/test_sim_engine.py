"""The simulator's contracts: every request ends once, KV budgets hold, runs repeat."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit._sim_factory import scenario
from triage.sim.compare import resolve, run_policy
from triage.sim.engine import Simulator
from triage.sim.histogram import NBUCKETS
from triage.sim.metrics import OUTCOMES
from triage.sim.policies import VARIANTS
from triage.topics.reasons import Outcome


def _without_wall(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "wall_s"}


@pytest.mark.parametrize("policy", list(VARIANTS))
def test_every_request_ends_in_exactly_one_outcome(policy: str) -> None:
    sc = scenario(duration_s=40.0, rate_a=10.0, rate_b=5.0)  # overloaded: every path runs
    _, pc = resolve(sc, policy)
    sim = Simulator(sc.config, sc.arrivals(), policy=pc, options=sc.options())
    r = sim.run()
    assert r.arrivals > 300
    assert r.conserved
    total = 0
    for t, m in r.tenants.items():
        ends = sum(m[o] for o in OUTCOMES)
        assert ends == m["requests"], (t, m)
        assert m["unfinished"] == 0
        total += m["requests"]
    assert total == r.arrivals
    assert sim.live_requests == 0  # nothing per-request survives the run
    for d in sim.core.dispatchers.values():
        assert not d.inflight and len(d.queue) == 0


@pytest.mark.parametrize("policy", ["full", "reject_only", "bounded_queue", "full-nopreempt"])
def test_memory_fit_policies_never_overflow_a_kv_budget(policy: str) -> None:
    sc = scenario(duration_s=40.0, rate_a=10.0, rate_b=6.0)
    _, pc = resolve(sc, policy)
    worst = {"ledger": 0.0, "engine": 0.0}

    def checked(now: float) -> None:  # after every event
        for d in sim.core.dispatchers.values():
            for slot in d.ledger.slots:
                worst["ledger"] = max(worst["ledger"], slot.used / slot.budget)
        for g in sim.gpus:
            e = g.engine
            worst["engine"] = max(worst["engine"], e.kv_used_bytes / e.kv_budget_bytes)

    sim = Simulator(sc.config, sc.arrivals(), policy=pc, options=sc.options(), on_event=checked)
    r = sim.run()
    assert worst["ledger"] <= 1.0
    assert worst["engine"] <= 1.0
    assert worst["ledger"] > 0.5  # the budget was actually under pressure
    assert r.pools["p"]["engine_preemptions"] == 0  # reservations cover the peak


def test_admit_all_overflows_the_engine_under_the_same_load() -> None:
    """The counterpart of the test above: without the ledger the engine thrashes."""
    r = run_policy(scenario(duration_s=40.0, rate_a=10.0, rate_b=6.0), "admit_all")
    assert r.pools["p"]["engine_preemptions"] > 0
    assert r.overall["recompute_tokens_engine"] > 0


def test_runs_are_deterministic_per_seed() -> None:
    a = run_policy(scenario(seed=4), "full")
    b = run_policy(scenario(seed=4), "full")
    c = run_policy(scenario(seed=5), "full")
    assert _without_wall(a.to_dict(series=True)) == _without_wall(b.to_dict(series=True))
    assert a.overall != c.overall


def test_reject_only_never_queues_and_admit_all_never_rejects() -> None:
    sc = scenario(duration_s=40.0, rate_a=12.0, rate_b=6.0)
    seen: dict[str, set[Outcome]] = {}
    for policy in ("reject_only", "admit_all"):
        _, pc = resolve(sc, policy)
        outcomes: set[Outcome] = set()

        def spy(decisions: list[Any], now: float, outcomes: set[Outcome] = outcomes) -> None:
            outcomes.update(d.outcome for d in decisions)

        sim = Simulator(sc.config, sc.arrivals(), policy=pc, options=sc.options(),
                        on_decisions=spy)
        r = sim.run()
        seen[policy] = outcomes
        if policy == "reject_only":
            assert r.overall["queued_fraction"] == 0.0
            assert r.overall["rejected"] > 0  # the load made it refuse
        else:
            assert r.overall["rejected"] == 0 and r.overall["timed_out"] == 0
            assert r.overall["acceptance"] == 1.0
    assert Outcome.QUEUE not in seen["reject_only"] and Outcome.TIMEOUT not in seen["reject_only"]
    assert Outcome.REJECT not in seen["admit_all"] and Outcome.QUEUE not in seen["admit_all"]


def test_metric_structures_have_fixed_size() -> None:
    sc = scenario(duration_s=120.0)
    _, pc = resolve(sc, "full")
    opts = sc.options()
    sim = Simulator(
        sc.config, sc.arrivals(), policy=pc,
        options=type(opts)(seed=1, gpu_noise=0.1, sample_s=0.05, max_points=64),
    )
    r = sim.run()
    assert r.series.n <= 65  # 120 s at 0.05 s would be 2,400 slots: merged instead
    assert r.series.interval >= 120.0 / 64
    for h in (*r.latency.values(), *r.wait.values()):
        assert len(h.counts) == NBUCKETS
    # merged counters keep their totals
    served = sum(sum(r.series.counter("served:" + t)) for t in ("a", "b"))
    assert served == pytest.approx(r.overall["tokens_completed"])


def test_recorded_request_ids_are_kept_for_replay() -> None:
    from tests.unit._sim_factory import sim_config
    from triage.admission.decision import Decision
    from triage.sim.workload import Arrival

    arrivals = [Arrival(0.1 * i, "a", "m8", 100, 20, 10, None, f"rec-{i}") for i in range(20)]
    seen: list[Decision] = []
    r = Simulator(sim_config(), arrivals,
                  on_decisions=lambda ds, now: seen.extend(ds)).run()
    assert r.conserved and r.arrivals == 20
    assert {d.request_id for d in seen} == {f"rec-{i}" for i in range(20)}


_FLAGS = ("quota", "borrowing", "memory_fit", "sla_fit", "queue", "fairness", "preemption",
          "hysteresis", "overage_when_idle", "pressure")


@settings(max_examples=30, deadline=None)
@given(
    preset=st.sampled_from(["full", "vtc", "edf", "bounded_queue", "reject_only", "clairvoyant"]),
    overrides=st.dictionaries(st.sampled_from(_FLAGS), st.booleans(), max_size=5),
    order=st.sampled_from([None, "fair", "fifo", "deadline"]),
)
def test_any_combination_of_flags_ends_every_request_once(
    preset: str, overrides: dict[str, bool], order: str | None,
) -> None:
    """Flags are user configuration: no combination may lose a request or preempt more
    than it starts. (The loop that once ran `full+sla_fit=false` out of memory needs a
    state this small run does not reach; tests/unit/test_preemption.py builds it.)"""
    policy = "+".join([preset, *(f"{k}={str(v).lower()}" for k, v in sorted(overrides.items())),
                       *([f"order={order}"] if order else [])])
    sc = scenario(duration_s=30.0, rate_a=10.0, rate_b=6.0)
    _, pc = resolve(sc, policy)
    sim = Simulator(sc.config, sc.arrivals(), policy=pc, options=sc.options())
    r = sim.run()
    assert r.conserved
    assert sum(m["requests"] for m in r.tenants.values()) == r.arrivals
    assert all(m["unfinished"] == 0 for m in r.tenants.values())
    dispatched = sum(d.stats.dispatched for d in sim.core.dispatchers.values())
    preempted = sum(d.stats.preemptions for d in sim.core.dispatchers.values())
    assert preempted <= dispatched // 2 + 1, policy  # each preemption paid for by a start
