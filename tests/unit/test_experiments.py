"""The seed's claims as experiments (docs/experiments.md), at a reduced size.

Each experiment runs once per module (fixtures) and the tests assert the direction
of its result, never exact figures or wall-clock times. Where a claim does not hold
in triage, the test asserts what does hold, and docs/experiments.md says why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from triage.cli.main import app
from triage.experiments import EXPERIMENTS, ExperimentResult
from triage.experiments import borrowing as borrow_mod
from triage.experiments import buffer as buffer_mod
from triage.experiments import degradation as p99_mod
from triage.experiments import preemption as preempt_mod
from triage.experiments import queueing as queue_mod
from triage.experiments.base import average_rows, offered_tokens_per_s, seeds_for
from triage.experiments.probes import isolated_latency_s, quantile, record, window_sums
from triage.experiments.traffic import shared_pool, shared_pool_at
from triage.sim.gpu import gpu_from_config
from triage.sim.scenario import scenario_from_dict

# Reduced sizes: large enough for the direction to be clear, small enough that the
# whole file runs in well under a minute.
SCALES = {"queue": 0.1, "p99": 0.2, "borrow": 0.1, "buffer": 0.15, "preempt": 0.05,
          "recipe": 0.05}


def _run(name: str) -> ExperimentResult:
    return EXPERIMENTS[name].run(scale=SCALES[name])


@pytest.fixture(scope="module")
def queue() -> ExperimentResult:
    return _run("queue")


@pytest.fixture(scope="module")
def p99() -> ExperimentResult:
    return _run("p99")


@pytest.fixture(scope="module")
def borrow() -> ExperimentResult:
    return _run("borrow")


@pytest.fixture(scope="module")
def buffer() -> ExperimentResult:
    return _run("buffer")


@pytest.fixture(scope="module")
def preempt() -> ExperimentResult:
    return _run("preempt")


@pytest.fixture(scope="module")
def recipe() -> ExperimentResult:
    return _run("recipe")


def _runs(res: ExperimentResult) -> dict[str, Any]:
    runs: dict[str, Any] = res.metrics["runs"]
    return runs


# --- the registry ---------------------------------------------------------------------

def test_every_claim_has_an_experiment() -> None:
    assert list(EXPERIMENTS) == [
        "queue", "p99", "borrow", "buffer", "preempt", "recipe", "baselines", "frontier"
    ]
    for e in EXPERIMENTS.values():
        assert e.claim and e.seed_figure
    with pytest.raises(ValueError):
        EXPERIMENTS["preempt"].run(scale=0)


# --- claim 1: bounded queue vs rejection-only ----------------------------------------

def test_queue_cuts_violations_in_a_memory_bound_pool(queue: ExperimentResult) -> None:
    mem = _runs(queue)["memory-bound"]
    reject, queued = mem[queue_mod.REJECT], mem[queue_mod.QUEUE]
    assert queue.holds
    assert queued["sla_violations"] < reject["sla_violations"]
    assert reject["refused"] > 0 and queued["refused"] == 0  # what was refused now waits
    assert queued["acceptance"] > reject["acceptance"]


def test_queue_helps_less_where_the_sla_check_refuses(queue: ExperimentResult) -> None:
    """Compute-bound: the refusals are predicted SLA misses, which a 2 s wait does not
    cure; the queue turns most of them into timeouts (docs: why ours differ)."""
    runs = _runs(queue)

    def relative_cut(pool: str) -> float:
        r = runs[pool]
        return 1.0 - r[queue_mod.QUEUE]["sla_violations"] / r[queue_mod.REJECT]["sla_violations"]

    cpu = runs["compute-bound"]
    assert cpu[queue_mod.REJECT]["refused"] > 0 and cpu[queue_mod.QUEUE]["refused"] == 0
    assert cpu[queue_mod.QUEUE]["timed_out"] > 0  # the refusals come back as timeouts
    assert relative_cut("memory-bound") > relative_cut("compute-bound")


def test_queue_load_is_what_the_claim_states(queue: ExperimentResult) -> None:
    assert queue.metrics["rho_achieved"] == pytest.approx([0.85, 0.85], rel=0.03)
    for pool in queue_mod.POOLS:
        assert _runs(queue)[pool][queue_mod.REJECT]["gpu_busy"] > 0.85


# --- claim 2: p99 degradation, rate limiting alone vs with admission ------------------

def test_admission_degrades_p99_less_than_rate_limiting(p99: ExperimentResult) -> None:
    assert p99.holds
    for pool in p99_mod.POOLS:
        rows = _runs(p99)[pool]
        full, limited = rows[p99_mod.FULL], rows[p99_mod.RATE_LIMIT]
        assert full["p99_degradation"] < limited["p99_degradation"], pool
        assert full["p99_loaded_s"] < limited["p99_loaded_s"], pool
        assert limited["acceptance"] == 1.0  # the buckets pass everything: contracts fit
        light = p99.metrics["light_load"]["runs"][pool][p99_mod.FULL]
        assert light["p99_degradation"] < full["p99_degradation"], pool  # grows with load


def test_isolated_latency_is_the_engine_alone() -> None:
    """The p99 baseline: a request alone on an idle GPU of the GPU model, no noise."""
    sc = shared_pool(1.0, duration_s=5.0, gpu_noise=0.0)
    _, recs = record(sc, "admit_all")
    r = recs[0]
    eng = gpu_from_config(sc.config, sc.config.all_gpus()[0])
    eng.submit("x", model=r.model, prompt_tokens=r.prompt, output_tokens=r.output, now=0.0)
    t = eng.next_event_time()
    assert t is not None
    (done,) = eng.advance(t)
    assert isolated_latency_s(sc, r) == pytest.approx(done.finished_at, rel=1e-9)


# --- claim 3: borrowing -----------------------------------------------------------------

def test_borrowing_reaches_about_3x_while_steady_tenants_keep_80pct(
    borrow: ExperimentResult,
) -> None:
    peak = borrow.metrics["peak_x_nominal"]["sized"]
    worst = borrow.metrics["steady_worst_window"]["sized"]
    assert borrow.holds
    assert 2.5 < peak[borrow_mod.BORROW] <= 3.05  # bucket + debt = 40 s of rate in 20 s
    assert peak[borrow_mod.NOBORROW] <= 2.05  # bucket alone = 20 s of rate
    assert worst[borrow_mod.BORROW] >= 0.8 and worst[borrow_mod.NOBORROW] >= 0.8


def test_borrowed_bursts_come_out_of_steady_tenants_in_a_tight_pool(
    borrow: ExperimentResult,
) -> None:
    """Where the pool cannot absorb the burst, the steady tenants' worst windows fall
    below 80%, further with borrowing than without (docs: why ours differ)."""
    worst = borrow.metrics["steady_worst_window"]["tight"]
    assert worst[borrow_mod.BORROW] < 0.8
    assert worst[borrow_mod.BORROW] < worst[borrow_mod.NOBORROW]
    assert borrow.metrics["peak_x_nominal"]["tight"][borrow_mod.BORROW] > 2.0


def test_window_sums_slide_by_arrival_time() -> None:
    sums = window_sums([0.5, 1.5, 2.5, 30.0], [1.0, 2.0, 4.0, 8.0], end=40.0, width=20.0)
    assert sums[0] == 7.0 and max(sums) == 8.0 and len(sums) == 21
    assert window_sums([1.0], [3.0], end=5.0, width=20.0) == [3.0]


# --- claim 4: the variance buffer ------------------------------------------------------

def test_buffer_trades_acceptance_for_fewer_late_requests(buffer: ExperimentResult) -> None:
    rows = _runs(buffer)
    b, n = rows[buffer_mod.BUFFERED], rows[buffer_mod.BARE]
    assert buffer.holds
    assert b["late"] < n["late"]
    assert b["acceptance"] < n["acceptance"]
    assert 0.0 < buffer.metrics["fewer_late"] < 1.0


# --- claim 5: preemption cost ----------------------------------------------------------

def test_preempting_at_half_costs_more_than_one_run(preempt: ExperimentResult) -> None:
    dist = preempt.metrics["distribution"]
    assert preempt.holds
    assert 1.5 <= dist["tokens"]["p50"] <= 2.0  # (2P + 1.5 O) / (P + O)
    assert dist["gpu_time_restart"]["p50"] > 1.3  # the decoded half is decoded again
    assert 1.0 <= dist["gpu_time_recompute"]["p50"] < 1.1  # re-prefilling is cheap


def test_core_preempts_halfway_and_counts_the_redo(preempt: ExperimentResult) -> None:
    case = preempt.metrics["core_case"]
    assert case["preempted"] == 1 and case["conserved"]
    assert case["sla_met"] == {"batch": 1, "interactive": 1}
    assert 0.4 < case["progress_at_preemption"] < 0.6
    prompt = preempt_mod.BATCH[0]
    # the core's count (prompt + predicted progress) is within 2% of the engine's truth
    assert case["core_recompute_tokens"] == pytest.approx(
        prompt + case["generated_before_preemption"], rel=0.02
    )
    assert case["gpu_time_ratio"] > 1.3 and case["token_ratio"] > 1.5


def test_token_work_formula() -> None:
    cfg = shared_pool(1.0, duration_s=5.0).config
    c = preempt_mod.request_costs(cfg, "llama-3.1-8b", 1000, 1000)
    assert c["tokens"] == pytest.approx(1.75)  # (2P + 1.5 O) / (P + O) with P = O
    assert c["gpu_time_recompute"] < c["gpu_time_restart"]


# --- the full policy vs the seed's recipe ----------------------------------------------

def test_full_beats_the_seed_recipe_somewhere_and_loses_nowhere_by_much(
    recipe: ExperimentResult,
) -> None:
    """docs/experiments.md reports these at full size, where full is ahead on all three;
    at CI size the runs are a tenth as long (the predictor barely learns), so the bar is:
    better on at least one scenario, and never more than one point worse."""
    assert recipe.holds and recipe.metrics["full_better"]
    for name, rows in _runs(recipe).items():
        assert rows["full"]["sla_violations"] <= rows["seed recipe"]["sla_violations"] + 0.01, name


def test_the_flood_scenario_keeps_its_well_behaved_tenants_whole(recipe: ExperimentResult) -> None:
    """adversarial: a tenant at 10x its quota may use idle capacity, never the capacity
    the tenants within their quota need (work conservation must not become a leak)."""
    adv = _runs(recipe)["adversarial"]
    for tenant in ("alpha", "beta"):
        assert adv["full"]["tenant_sla_attainment"][tenant] >= (
            adv["seed recipe"]["tenant_sla_attainment"][tenant] - 0.06
        )


# --- the machinery ----------------------------------------------------------------------

def test_load_is_set_from_measured_capacity() -> None:
    spec, cap, rho = shared_pool_at(0.8, duration_s=60.0, gpus=4, kv_gib=30.0, burst_s=5.0)
    offered = offered_tokens_per_s(scenario_from_dict(spec))
    assert cap > 0
    assert offered / cap == pytest.approx(rho)
    assert rho == pytest.approx(0.8, rel=0.03)


def test_seeds_and_averages() -> None:
    assert seeds_for(0.1) == (5,) and len(seeds_for(1.0)) == 3
    row = average_rows([{"a": 1.0, "b": "x", "c": None}, {"a": 3.0, "b": "y", "c": 2.0}])
    assert row["a"] == 2.0 and row["b"] == "x" and row["by_seed"]["a"] == [1.0, 3.0]
    assert "c" not in row["by_seed"]
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0 and quantile([], 0.5) is None


def test_cli_runs_writes_and_rejects(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, [
        "experiments", "preempt", "--scale", "0.05", "--json", "--out", str(tmp_path),
    ])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("["):])
    assert [r["name"] for r in out] == ["preempt"] and out[0]["holds"] is True
    assert json.loads((tmp_path / "results.json").read_text())[0]["name"] == "preempt"
    res = runner.invoke(app, ["experiments", "nonesuch"])
    assert res.exit_code == 2 and "unknown" in res.output
    res = runner.invoke(app, ["experiments", "--list"])
    assert res.exit_code == 0 and "borrow" in res.output


def test_written_scenarios_rerun_with_triage_sim(tmp_path: Path) -> None:
    from triage.cli.experiments_cmd import write_out

    res = ExperimentResult(
        name="queue", claim="c", seed_figure="s", our_figure="o", direction="d", holds=True,
        scale=0.02,
        specs={"q": {**shared_pool_at(0.5, duration_s=10.0, gpus=2, kv_gib=10.0).spec,
                     "policies": list(queue_mod.POLICIES)}},
    )
    paths = write_out([res], tmp_path)
    run = CliRunner().invoke(app, ["sim", str(paths[1]), "--json"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout[run.stdout.index("{"):])
    assert out["policies"] == list(queue_mod.POLICIES)


# --- issue 9's bar: full against every baseline (triage experiments baselines) -----------

# long-context@100 left on 2026-12-07: with `cancel_late` it misses `vtc`'s weighted figure
# by 0.10 point at the shipped seed and passes at seeds 101 and 102, where it failed before
# (docs/experiments.md, "Stopping late work")
BAR_HOLDS_TODAY = (
    "adversarial", "azure-trace", "two-services@85", "two-services@100", "two-services@120",
)


def test_the_full_policy_clears_the_baseline_bar_where_it_does_today() -> None:
    """A regression guard, at full size (the bar is about counts: SLA met, goodput): the
    cases where full is at or above every baseline today stay so. docs/experiments.md
    lists the cases that do not pass yet and why."""
    from triage.experiments import baselines

    res = baselines.run(scale=1.0, jobs=1, cases=BAR_HOLDS_TODAY, seeds=(None,))
    assert res.metrics["passing"] == list(BAR_HOLDS_TODAY), res.notes
    for case in BAR_HOLDS_TODAY:  # and the reference is really above the baselines' floor
        runs = res.metrics["runs"][case]
        assert runs["full"]["sla"] > runs["admit_all"]["sla"]


def test_the_bar_is_judged_at_every_seed() -> None:
    """A verdict is judged at each seed apart (the shipped seed's rows stay `runs`), and
    the experiment holds only when every case passes at every seed."""
    from triage.experiments import baselines

    case = ("two-services@85",)
    res = baselines.run(scale=0.03, jobs=1, cases=case, seeds=(None, 101))
    by_seed = res.metrics["runs_by_seed"]
    assert res.metrics["seeds"] == ["shipped", "101"]
    assert by_seed["shipped"] == res.metrics["runs"]
    assert by_seed["101"][case[0]]["full"] != by_seed["shipped"][case[0]]["full"]
    passes = res.metrics["passing_seeds"][case[0]]
    assert res.holds == (passes == ["shipped", "101"])
    assert (case[0] in res.metrics["passing_at_every_seed"]) == res.holds
    assert baselines.run(scale=0.03, jobs=1, cases=case).metrics["seeds"] == ["shipped"]


def test_steady_gaps_are_those_behind_at_every_seed() -> None:
    """A figure counts as steadily behind only when full trails that baseline at every
    seed; a gap that changes sign with the seed is noise."""
    from triage.experiments import baselines
    from triage.sim.scenario import load_scenario

    sc = load_scenario("two-services")
    good = {"sla": 0.9, "weighted": 0.9, "goodput": 100.0,
            "tenants": {"code": 0.9, "conv": 0.9}}
    seeded = []
    for edf_goodput, vtc_sla in ((110.0, 0.95), (104.0, 0.85)):
        rows = {p: dict(good) for p in ("full", *baselines.BASELINES, baselines.REFERENCE)}
        rows["edf"] = {**good, "goodput": edf_goodput}
        rows["vtc"] = {**good, "sla": vtc_sla}
        seeded.append(rows)
    gaps = baselines.steady_gaps(sc, seeded)
    assert gaps == ["goodput 6.47% behind edf"], gaps
    seeded[1]["reject_only"] = {**good, "tenants": {"code": 0.93, "conv": 0.9}}
    seeded[0]["reject_only"] = {**good, "tenants": {"code": 0.95, "conv": 0.9}}
    assert baselines.steady_gaps(sc, seeded)[1] == "tenant code 3.00 pt behind reject_only"


def test_the_bar_names_what_fails() -> None:
    from triage.experiments import baselines
    from triage.sim.scenario import load_scenario

    sc = load_scenario("two-services")
    good = {"sla": 0.9, "weighted": 0.9, "goodput": 100.0,
            "tenants": {t.name: 0.9 for t in sc.config.tenants}}
    rows = {p: dict(good) for p in ("full", *baselines.BASELINES, baselines.REFERENCE)}
    assert baselines.judge(sc, rows) == []
    rows["vtc"] = {**good, "sla": 0.95,
                   "tenants": {t.name: 0.95 for t in sc.config.tenants}}
    rows[baselines.REFERENCE] = {**good, "goodput": 200.0}
    misses = baselines.judge(sc, rows)
    assert any(m.startswith("SLA") and "vtc" in m for m in misses)
    assert any(m.startswith("tight tenant") for m in misses)
    assert any("clairvoyant" in m for m in misses)
    gaps = dict(baselines.shortfalls(sc, rows))
    assert list(gaps) == misses  # judge names exactly the checks shortfalls measures
    sla_gap = next(g for m, g in gaps.items() if m.startswith("SLA"))
    assert sla_gap == pytest.approx(5.0)  # 95% vs 90%: five points
    tenant_gap = next(g for m, g in gaps.items() if m.startswith("tight tenant"))
    assert tenant_gap == pytest.approx(4.0)  # five points, less the one-point slack
    goodput_gap = next(g for m, g in gaps.items() if "clairvoyant" in m)
    assert goodput_gap == pytest.approx(45.0)  # 100 against 95% of 200, in % of 200


def test_each_policy_is_judged_against_all_the_others() -> None:
    """clears_against_all seats each baseline where full sits: a policy clears a case
    only when it is at or above every other one on every figure; two policies that each
    lead on one figure leave the case cleared by none."""
    from triage.experiments import baselines
    from triage.sim.scenario import load_scenario

    sc = load_scenario("two-services")
    good = {"sla": 0.9, "weighted": 0.9, "goodput": 100.0,
            "tenants": {t.name: 0.9 for t in sc.config.tenants}}
    rows = {p: dict(good) for p in ("full", *baselines.BASELINES, baselines.REFERENCE)}
    assert baselines.clears_against_all(sc, rows) == ["full", *baselines.BASELINES]
    rows["edf"] = {**good, "sla": 0.95}  # edf leads on requests: it alone clears
    assert baselines.clears_against_all(sc, rows) == ["edf"]
    rows["vtc"] = {**good, "weighted": 0.95}  # vtc leads on the weighted figure: nobody
    assert baselines.clears_against_all(sc, rows) == []
    rows["full"] = {**good, "sla": 0.95, "weighted": 0.95}  # full leads on both
    assert baselines.clears_against_all(sc, rows) == ["full"]


# --- the search over settings (triage experiments frontier) ----------------------------

def test_the_frontier_grid_is_48_valid_policy_strings_full_first() -> None:
    from triage.experiments import frontier
    from triage.sim.policies import policy_config

    grid = frontier.grid()
    assert grid[0] == "full" and len(grid) == len(set(grid)) == 48
    assert "clairvoyant+queue=false+hysteresis=false" in grid
    for name in grid:
        policy_config(name)  # raises on a string the core cannot run


def test_the_nearest_miss_is_the_smallest_largest_shortfall() -> None:
    from triage.experiments import frontier

    rows = {"a": [("x", 3.0), ("y", 0.5)], "b": [("x", 2.0), ("y", 1.9)], "c": [("z", 2.5)]}
    assert frontier.nearest(rows) == ("b", 2.0)
    rows["d"] = []
    assert frontier.nearest(rows) == ("d", 0.0)


def test_the_frontier_judges_full_as_the_bar_does() -> None:
    """The search's own `full` row is judged exactly as `baselines` judges the full policy
    on the same case and scale (same core, same baselines, same bar)."""
    from triage.experiments import baselines, frontier

    case = ("tenants13@120",)
    searched = frontier.run(scale=0.03, jobs=1, cases=case)
    direct = baselines.run(scale=0.03, jobs=1, cases=case)
    full = direct.metrics["runs"][case[0]]["full"]
    row = searched.metrics["runs"][case[0]]["full"]
    assert (row["sla"], row["weighted"], row["goodput"]) == (
        full["sla"], full["weighted"], full["goodput"])
    summary = searched.metrics["cases"][case[0]]
    assert ("full" in summary["passing"]) == (not direct.metrics["failures"][case[0]])
    assert summary["nearest"] in frontier.grid()
