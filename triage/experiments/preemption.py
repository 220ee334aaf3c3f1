"""Claim 5: preempting a request half way and running it again costs about 1.8x its compute.

The seed: preempting a request at 50% completion and restarting it later cost 1.8x
the total compute of letting it finish and queueing the newcomer.

Compute has two honest measures and they disagree, so we report both:

- token work: tokens the GPU processes for the request, prefill and decode alike.
  Run once: P + O. Preempted after g = O/2 tokens, then run again: the first attempt
  did P + g, the second P + O (restarted from its prompt) or P + g then O - g
  (resumed by re-prefilling prompt and generated tokens, as vLLM's recompute does):
  either way 2P + 1.5 O, so the ratio is (2P + 1.5 O) / (P + O), between 1.5x
  (output-heavy) and 2x (prompt-heavy);
- GPU time: seconds of the simulator's GPU model (SimulatedGpu, alone, no noise).
  A prefilled token costs a small fraction of a decoded one, so a restart (the
  generated half decoded again) costs about 1.5x, and a recompute resume about 1x.

Two parts. (1) The distribution of both ratios over requests drawn from the
shared pool's four tenants, on the GPU model. (2) The core's own rule firing in a
hand-made run: a batch request runs alone on one GPU; halfway through, an
interactive request arrives that needs its KV memory and has less slack than half
the batch request's remaining time; the core preempts, runs the newcomer, then
reruns the batch request. Its GPU busy time and token work are compared with
letting it finish and then serving the newcomer. In triage a preempted request
returns to the queue and is dispatched later as a new work item, so it restarts
from its prompt.
"""

from __future__ import annotations

from typing import Any

from triage.admission.decision import Decision
from triage.config import config_from_dict
from triage.config.models import TriageConfig
from triage.experiments.base import Experiment, ExperimentResult
from triage.experiments.probes import quantile
from triage.experiments.traffic import MODEL_8B, a100_gpu_type, a100_pool, shared_pool
from triage.sim.engine import SimOptions, Simulator
from triage.sim.gpu import gpu_from_config
from triage.sim.policies import policy_config
from triage.sim.workload import Arrival
from triage.topics.reasons import Outcome

NAME = "preempt"
CLAIM = "preempting a request at 50% completion and running it again costs ~1.8x its compute"
SEED_FIGURE = "1.8x total compute"
FRACTION = 0.5
SAMPLE = 2000  # requests in a full-size run


def _run_alone(
    cfg: TriageConfig, gpu: str, model: str, jobs: list[tuple[int, int, int | None]]
) -> float:
    """GPU seconds to run `jobs` one after another on an idle GPU: (prompt, output,
    abort after this many generated tokens, or None to finish)."""
    eng = gpu_from_config(cfg, gpu)
    m = cfg.model(model)
    assert m is not None
    speed = cfg.gpu_type(cfg.pool(m.pool).gpu_type).speed
    now = 0.0
    for key, (prompt, output, stop) in enumerate(jobs):
        eng.submit(key, model=model, prompt_tokens=prompt, output_tokens=output, now=now)
        if stop is None:
            t = eng.next_event_time()
            assert t is not None
            now = t
            eng.advance(now)
        else:  # just past the decode step that produced the stop-th token
            now += (prompt * m.prefill_s_per_token + (stop + 0.5) * m.decode_s_per_token) / speed
            fs = eng.abort(key, now)
            assert fs is not None and fs.output_tokens == stop
    return eng.busy_seconds


def request_costs(cfg: TriageConfig, model: str, prompt: int, output: int) -> dict[str, float]:
    """Token-work and GPU-time ratios of one request preempted at FRACTION."""
    gpu = cfg.all_gpus()[0]
    g = int(output * FRACTION)
    once = _run_alone(cfg, gpu, model, [(prompt, output, None)])
    restart = _run_alone(cfg, gpu, model, [(prompt, output, g), (prompt, output, None)])
    resume = _run_alone(
        cfg, gpu, model, [(prompt, output, g), (prompt + g, max(1, output - g), None)]
    )
    return {
        "tokens": (2 * prompt + g + output) / (prompt + output),
        "gpu_time_restart": restart / once,
        "gpu_time_recompute": resume / once,
    }


def _case_config() -> TriageConfig:
    """One A100 whose KV holds the batch request or the newcomer, not both."""
    common = {"rate_tokens_per_s": 1e6, "burst_tokens": 1e7, "queue_max": 10,
              "output_ratio_prior": 1.0}
    return config_from_dict({
        "tenants": [
            {"name": "batch", "sla_ms": 120_000, "max_queue_wait_ms": 60_000, **common},
            {"name": "interactive", "sla_ms": 3000, "max_queue_wait_ms": 2000, "weight": 2.0,
             **common},
        ],
        "models": [dict(MODEL_8B)], "gpu_types": [a100_gpu_type(30.0)],
        "pools": [a100_pool(1, 0.62, queue_max=10)],
        "hysteresis": {"low": 0.85, "high": 0.9},
    }, source="preemption case")


BATCH = (3000, 600)  # prompt, output (= max_tokens) of the preempted request
NEWCOMER = (2000, 100)


def core_case() -> dict[str, Any]:
    """The core's preemption rule in a hand-made run, against finish-then-serve."""
    cfg = _case_config()
    m = cfg.model(MODEL_8B["name"])
    assert m is not None
    speed = cfg.gpu_type(cfg.pool(m.pool).gpu_type).speed
    p_a, o_a = BATCH
    p_b, o_b = NEWCOMER
    half = (p_a * m.prefill_s_per_token + o_a * FRACTION * m.decode_s_per_token) / speed
    arrivals = [
        Arrival(0.0, "batch", m.name, p_a, o_a, o_a, request_id="batch-1"),
        Arrival(half - 0.03, "interactive", m.name, p_b, o_b, o_b, request_id="chat-1"),
    ]
    seen: list[Decision] = []
    sim = Simulator(
        cfg, iter(arrivals), policy=policy_config("full"),
        options=SimOptions(seed=1, gpu_noise=0.0, sample_s=1.0), scenario="preempt-case",
        on_decisions=lambda ds, _now: seen.extend(ds),
    )
    result = sim.run()
    busy = sum(g.engine.busy_seconds for g in sim.gpus)
    pre = [d for d in seen if d.outcome is Outcome.PREEMPT]
    dispatch = [d for d in seen if d.outcome is Outcome.ACCEPT and d.request_id == "batch-1"]
    out: dict[str, Any] = {
        "preempted": len(pre), "conserved": result.conserved,
        "sla_met": {t: result.tenants[t]["sla_met"] for t in result.tenants},
    }
    if not pre or not dispatch:
        return out
    t_pre = pre[0].at
    # the batch request ran alone (noise off) until the preemption: its progress is exact
    generated = int(
        (t_pre - dispatch[0].at - p_a * m.prefill_s_per_token / speed)
        / (m.decode_s_per_token / speed)
    )
    gpu = cfg.all_gpus()[0]
    alone_a = _run_alone(cfg, gpu, m.name, [(p_a, o_a, None)])
    alone_b = _run_alone(cfg, gpu, m.name, [(p_b, o_b, None)])
    out.update({
        "progress_at_preemption": generated / o_a,
        "core_recompute_tokens": pre[0].recompute_tokens,
        "generated_before_preemption": generated,
        "gpu_busy_s": busy, "gpu_busy_without_preemption_s": alone_a + alone_b,
        "run_ratio": busy / (alone_a + alone_b),
        "gpu_time_ratio": (busy - alone_b) / alone_a,
        "token_ratio": (2 * p_a + generated + o_a) / (p_a + o_a),
    })
    return out


def run(scale: float, jobs: int) -> ExperimentResult:
    n = max(100, round(SAMPLE * scale))
    sc = shared_pool(1.0, duration_s=600.0)
    cfg = sc.config
    sample = []
    for a in sc.arrivals():
        sample.append(request_costs(cfg, a.model, a.prompt_tokens, a.output_tokens))
        if len(sample) >= n:
            break
    dist = {
        k: {q: quantile([s[k] for s in sample], x) for q, x in (("p10", 0.1), ("p50", 0.5),
                                                                  ("p90", 0.9))}
        for k in ("tokens", "gpu_time_restart", "gpu_time_recompute")
    }
    case = core_case()
    tok = dist["tokens"]["p50"] or 0.0
    restart = dist["gpu_time_restart"]["p50"] or 0.0
    resume = dist["gpu_time_recompute"]["p50"] or 0.0
    holds = tok > 1.0 and restart > 1.0 and resume >= 1.0 and case.get("preempted", 0) == 1
    ours = (
        f"token work {tok:.2f}x (p10-p90 {dist['tokens']['p10']:.2f}-"
        f"{dist['tokens']['p90']:.2f}); GPU time {restart:.2f}x restarted, {resume:.2f}x resumed"
    )
    notes = [f"{n} requests of the shared pool's four tenants, preempted after "
             f"{FRACTION:.0%} of their output tokens, alone on an A100 of the GPU model"]
    if "progress_at_preemption" in case:
        notes.append(
            f"core case: the rule fired at {case['progress_at_preemption']:.0%} of the batch "
            f"request's output; GPU time {case['gpu_time_ratio']:.2f}x for it "
            f"({case['run_ratio']:.2f}x for the whole run), token work "
            f"{case['token_ratio']:.2f}x; the core counted {case['core_recompute_tokens']} "
            f"tokens to redo (the engine had generated {case['generated_before_preemption']})"
        )
    else:
        notes.append("core case: the preemption rule did not fire")
    return ExperimentResult(
        name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, our_figure=ours,
        direction="preempting at 50% costs more than 1x the compute of one run, in token "
        "work and in GPU time (restarted), and the core's rule fires in the hand-made case",
        holds=holds, scale=scale, notes=notes,
        metrics={"fraction": FRACTION, "sample": n, "distribution": dist, "core_case": case},
    )


EXPERIMENT = Experiment(name=NAME, claim=CLAIM, seed_figure=SEED_FIGURE, run_fn=run)
