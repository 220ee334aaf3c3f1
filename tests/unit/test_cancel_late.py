"""`policy.cancel_late`: a tightened pool stops the runners already past their deadline.

Each test fails on the core before the knob: late work used to run to its end whatever
the pool's state (docs/policy.md, "Stopping late work").
"""

from __future__ import annotations

from _core_factory import BYTES_PER_TOKEN, config, tenant

from triage.admission.core import AdmissionCore
from triage.admission.decision import Decision
from triage.config.models import PolicyConfig, PolicyPreset
from triage.sim.engine import SimOptions, Simulator
from triage.sim.workload import Arrival
from triage.streams.codec import control_for
from triage.topics.messages import ControlKind
from triage.topics.reasons import Outcome, ReasonCode

GIB = 1024**3


def _one_gpu_core(policy: dict[str, object] | None = None) -> AdmissionCore:
    """One GPU with room for one 1,000-token request; tenant `a` has a 5 s SLA."""
    cfg = config(tenants=[tenant("a", sla_ms=5_000, max_queue_wait_ms=30_000)], gpus=1,
                 kv_budget_gib=1_200 * BYTES_PER_TOKEN / GIB, policy=policy)
    return AdmissionCore(cfg)


def _start_and_queue(core: AdmissionCore) -> None:
    assert core.submit("late", "a", "m8", 500, 500, 0.0)[0].outcome is Outcome.ACCEPT
    waiting = core.submit("next", "a", "m8", 500, 500, 0.1, sla_s=60.0)[0]
    assert (waiting.outcome, waiting.reason) == (Outcome.QUEUE,
                                                 ReasonCode.GPU_MEMORY_INSUFFICIENT)


def _cut(out: list[Decision]) -> list[Decision]:
    return [d for d in out if d.outcome is Outcome.TIMEOUT and d.gpu_id is not None]


def test_a_tightened_pool_stops_a_runner_past_its_deadline_and_its_room_goes_on() -> None:
    core = _one_gpu_core()
    _start_and_queue(core)
    d = core.dispatchers["p"]
    d.monitor.tightened = True
    assert not _cut(core.tick(4.9))  # not late yet
    # late (deadline 5 s) but not yet 1.5x its predicted 4.55 s: maybe near its end
    assert not _cut(core.tick(5.5))
    out = core.tick(7.0)
    [cut] = _cut(out)
    assert (cut.request_id, cut.reason, cut.gpu_id) == ("late", ReasonCode.DEADLINE_UNREACHABLE,
                                                        "g0")
    assert cut.slack_s is not None and cut.slack_s < 0
    assert "late" not in d.inflight and d.stats.cut_late == 1
    # its memory went to the request waiting for it, in the same pass
    assert [x.request_id for x in out if x.outcome is Outcome.ACCEPT] == ["next"]
    # the worker's report of the stopped attempt changes nothing: one terminal reply
    late_report = core.complete(pool="p", request_id="late", attempt=0, ok=True,
                                output_tokens=400, prefill_s=0.01, decode_s=1.6,
                                concurrency=1.0, now=7.1)
    assert not [x for x in late_report if x.request_id == "late"]


def test_late_work_runs_to_its_end_below_saturation_or_when_the_policy_says_so() -> None:
    relaxed = _one_gpu_core()
    _start_and_queue(relaxed)
    assert not _cut(relaxed.tick(7.0))  # the pool is not tightened: nobody waits for it
    assert "late" in relaxed.dispatchers["p"].inflight
    off = _one_gpu_core({"preset": "full", "cancel_late": False})
    _start_and_queue(off)
    off.dispatchers["p"].monitor.tightened = True
    assert not _cut(off.tick(7.0))
    assert "late" in off.dispatchers["p"].inflight


def test_a_cut_request_teaches_the_variance_buffer_the_time_it_ran() -> None:
    """Cut requests are the slow ones: the buffer learns the time each ran (a lower
    bound of its service time) as a completion's. The output ratio learns nothing from
    a guess (docs/policy.md, "Stopping late work")."""
    core = _one_gpu_core()
    assert core.submit("late", "a", "m8", 100, 50, 0.0)[0].outcome is Outcome.ACCEPT
    buffer = core.predictor.buffer("m8")
    ratio = core.predictor.ratio("a")
    samples, ratio_weight = len(buffer._sorted), ratio.weight
    core.dispatchers["p"].monitor.tightened = True
    assert _cut(core.tick(6.0))
    assert len(buffer._sorted) == samples + 1
    assert buffer._sorted[-1] > 5.0  # 6 s against ~0.35 s predicted
    assert ratio.weight == ratio_weight


def test_the_stopped_attempt_is_cancelled_on_its_gpu() -> None:
    core = _one_gpu_core()
    _start_and_queue(core)
    core.dispatchers["p"].monitor.tightened = True
    [cut] = _cut(core.tick(7.0))
    control = control_for(cut)
    assert control is not None
    assert (control.kind, control.request_id, control.attempt, control.gpu_id) == (
        ControlKind.CANCEL, "late", 0, "g0")
    # a request that times out in the queue has no attempt to stop
    short_wait = AdmissionCore(config(tenants=[tenant("a", sla_ms=5_000)], gpus=1,
                                      kv_budget_gib=1_200 * BYTES_PER_TOKEN / GIB))
    _start_and_queue(short_wait)
    [expired] = [x for x in short_wait.tick(3.0) if x.outcome is Outcome.TIMEOUT]
    assert (expired.request_id, expired.gpu_id) == ("next", None)
    assert control_for(expired) is None


def test_the_simulator_stops_what_the_core_cut_and_every_request_ends_once() -> None:
    """Overload on one GPU with a tight SLA: the core cuts late runners, the simulated
    engine stops running them, and no cut request completes afterwards."""
    cfg = config(tenants=[tenant("a", sla_ms=8_000, queue_max=400,
                                 max_queue_wait_ms=1_500)],
                 gpus=1, kv_budget_gib=40_000 * BYTES_PER_TOKEN / GIB)
    arrivals = [Arrival(0.02 * i, "a", "m8", 300, 400, 20 + (i * 37) % 380)
                for i in range(3000)]
    seen: dict[str, list[Decision]] = {}

    def record(decisions: list[Decision], _now: float) -> None:
        for x in decisions:
            seen.setdefault(x.request_id, []).append(x)

    sim = Simulator(cfg, arrivals, policy=PolicyConfig(preset=PolicyPreset.FULL),
                    options=SimOptions())
    sim.on_decisions = record
    result = sim.run()
    assert result.conserved
    cut = [rid for rid, ds in seen.items()
           if any(x.outcome is Outcome.TIMEOUT and x.gpu_id is not None for x in ds)]
    assert cut, "the overload never tightened the pool"
    for rid in cut:
        assert not [x for x in seen[rid] if x.outcome is Outcome.COMPLETE]
    assert sim.core.dispatchers["p"].stats.cut_late == len(cut)


def test_stopping_late_work_pays_where_late_completions_were_the_misses() -> None:
    """`tenants13@100`, full size: most of the dominant tenant's misses were late
    completions. Stopping them on the saturated pool gives their decode steps to
    requests that still make it: more requests within SLA and more goodput."""
    from triage.experiments.baselines import case_scenario, measure

    sc = case_scenario("tenants13@100", 1.0)
    cut = measure(sc, "full")
    ran_on = measure(sc, "full+cancel_late=false")
    assert cut["sla"] > ran_on["sla"] + 0.02
    assert cut["goodput"] > 1.03 * ran_on["goodput"]
    assert cut["weighted"] > ran_on["weighted"]
    assert cut["tenants"]["assistant"] > ran_on["tenants"]["assistant"] + 0.04
