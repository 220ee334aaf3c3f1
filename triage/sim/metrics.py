"""What a simulated run measured: per tenant and overall, in memory that does not
grow with the number of requests (counters, log histograms, fixed-interval series).

Definitions (the report and docs/experiments.md use these words):

- SLA attainment: requests that completed within their SLA / requests that arrived
  (a refusal, a timeout, a failure or an unfinished request is a miss);
  `sla_attainment_completed` divides by completed requests instead (labelled so
  wherever it is shown: a policy that refuses more looks better by it).
- weight-normalized SLA attainment: sum over tenants of weight x attainment / sum of
  their weights, over the tenants that sent at least one request. The request-count
  headline lets a busy tenant hide a small heavy one; this one does not.
- SLA by prompt length: the same ratio within prompt-length buckets (PROMPT_EDGES).
- predictor error: actual / predicted execution time of each completed request, where
  predicted is the dispatch decision's `predicted_s` (the prediction times the
  variance buffer: what the SLA check used) and actual the time the GPU reported
  (prefill + decode from submission to the engine, its own queue included). Above 1:
  the SLA check was optimistic.
- retry hints: `retry_after_s` of every refusal and timeout that carried one; a
  refusal without one is final (the request can never fit as asked).
- goodput: prompt + output tokens of requests that met their SLA, per GPU-second of
  the run (GPUs x makespan).
- queue wait: arrival to the start of the attempt that completed, on its GPU: the
  front-door queue and the engine's own queue both count, so admit-all (which
  queues inside the engine) is measured like the rest.
- preemption rate: (core preemptions + engine KV-overflow preemptions) / admitted.
- fairness: see triage/sim/fairshare.py (weighted max-min shares per series slot).
"""

from __future__ import annotations

from typing import Any, Final

from triage.sim.histogram import LogHistogram
from triage.sim.series import TimeSeries

OUTCOMES = ("completed", "rejected", "timed_out", "failed", "unfinished")
# prompt-length buckets: [0, 512), [512, 2k), [2k, 8k), [8k, 32k), [32k, inf)
PROMPT_EDGES: Final = (512, 2048, 8192, 32768)
PROMPT_LABELS: Final = ("<512", "512-2k", "2k-8k", "8k-32k", "32k+")
_E0: Final = 512  # the edges as native ints for prompt_bucket (hot: every arrival)
_E1: Final = 2048
_E2: Final = 8192
_E3: Final = 32768
NPROMPT: Final = 5


def prompt_bucket(prompt: int) -> int:
    """Index of a prompt length's bucket in PROMPT_LABELS."""
    if prompt < _E1:
        return 0 if prompt < _E0 else 1
    if prompt < _E2:
        return 2
    return 3 if prompt < _E3 else 4


class TenantStats:
    """Counters and histograms of one tenant (the engine calls these on decisions)."""

    __slots__ = (
        "_arrived_key", "_demand_key", "_met_key", "_refusal_keys", "_served_key", "admitted",
        "arrived_by_prompt", "completed", "completed_by_prompt", "core_preemptions",
        "engine_preemptions", "failed", "final_refusals", "latency", "met_by_prompt", "name",
        "pred_error", "queued", "queued_by_reason", "recompute_core", "recompute_engine",
        "rejected", "rejected_by_reason", "requests", "retry_hint", "series", "sla_met",
        "timed_out", "timed_out_by_reason", "tokens_completed", "tokens_met", "ttft",
        "under_predicted", "unfinished", "wait", "weight",
    )  # fmt: skip

    def __init__(self, name: str, weight: float, series: TimeSeries) -> None:
        self.name = name
        self.weight = weight
        self.series = series
        self._demand_key = "demand:" + name  # series names, built once (a million adds)
        self._served_key = "served:" + name
        self._arrived_key = "arrived:" + name  # requests by arrival slot ...
        self._met_key = "met:" + name  # ... and those of them that met the SLA
        self._refusal_keys: dict[str, str] = {}  # reason -> "refused:<reason>" (built once)
        self.requests = 0
        self.admitted = 0  # dispatched at least once
        self.queued = 0  # waited in the front-door queue at least once
        self.queued_by_reason: dict[str, int] = {}  # why it waited (first QUEUE decision)
        self.completed = 0
        self.rejected = 0
        self.rejected_by_reason: dict[str, int] = {}
        self.timed_out = 0
        self.timed_out_by_reason: dict[str, int] = {}
        self.failed = 0
        self.unfinished = 0  # still live when the drain limit ended the run
        self.sla_met = 0
        self.tokens_met = 0
        self.tokens_completed = 0
        self.core_preemptions = 0
        self.engine_preemptions = 0
        self.recompute_core = 0
        self.recompute_engine = 0
        self.latency = LogHistogram()
        self.wait = LogHistogram()
        self.ttft = LogHistogram()
        self.arrived_by_prompt = [0] * NPROMPT
        self.completed_by_prompt = [0] * NPROMPT
        self.met_by_prompt = [0] * NPROMPT
        self.pred_error = LogHistogram()  # actual / predicted execution time
        self.under_predicted = 0  # completions whose actual time exceeded the prediction
        self.retry_hint = LogHistogram()  # retry_after_s of refusals and timeouts with one
        self.final_refusals = 0  # refusals and timeouts without a hint

    # --- terminal outcomes: exactly one per request -----------------------------------
    def complete(
        self, *, arrived: float, sla_s: float, tokens: int, started: float, first_token: float,
        finished: float, prompt: int, predicted_s: float | None, run_s: float,
    ) -> None:
        """A request completed: `predicted_s` is its dispatch's prediction (None: none
        was made) and `run_s` the execution time its GPU reported."""
        self.completed += 1
        b = prompt_bucket(prompt)
        self.completed_by_prompt[b] += 1
        latency = finished - arrived
        self.latency.add(latency)
        wait = started - arrived
        self.wait.add(wait)
        self.ttft.add(first_token - arrived)
        self.tokens_completed += tokens
        s = self.series
        if latency <= sla_s + 1e-9:
            self.sla_met += 1
            self.tokens_met += tokens
            self.met_by_prompt[b] += 1
            s.add(self._met_key, arrived, 1.0)
        s.add(self._served_key, finished, tokens)
        if predicted_s is not None and predicted_s > 0.0:
            ratio = run_s / predicted_s
            self.pred_error.add(ratio)
            if ratio > 1.0:
                self.under_predicted += 1

    def queue(self, reason: str) -> None:
        """First time a request waits in the front-door queue."""
        self.queued += 1
        self.queued_by_reason[reason] = self.queued_by_reason.get(reason, 0) + 1

    def arrive(self, t: float, prompt: int, output: int) -> None:
        self.requests += 1
        self.arrived_by_prompt[prompt_bucket(prompt)] += 1
        s = self.series
        s.add(self._demand_key, t, prompt + output)
        s.add(self._arrived_key, t, 1.0)

    def reject(self, reason: str, t: float, retry_after_s: float | None) -> None:
        self.rejected += 1
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1
        self._refused(reason, t, retry_after_s)

    def timeout(self, reason: str, t: float, retry_after_s: float | None) -> None:
        self.timed_out += 1
        self.timed_out_by_reason[reason] = self.timed_out_by_reason.get(reason, 0) + 1
        self._refused(reason, t, retry_after_s)

    def _refused(self, reason: str, t: float, retry_after_s: float | None) -> None:
        """A refusal or timeout: counted by reason over time, its hint kept."""
        key = self._refusal_keys.get(reason)
        if key is None:
            key = self._refusal_keys[reason] = "refused:" + reason
        self.series.add(key, t, 1.0)
        if retry_after_s is None:
            self.final_refusals += 1
        else:
            self.retry_hint.add(retry_after_s)

    def fail(self) -> None:
        self.failed += 1

    @property
    def terminal(self) -> int:
        return self.completed + self.rejected + self.timed_out + self.failed + self.unfinished

    # --- summaries ------------------------------------------------------------------
    def by_prompt(self) -> dict[str, dict[str, Any]]:
        """SLA attainment per prompt-length bucket (buckets with no arrivals left out)."""
        out: dict[str, dict[str, Any]] = {}
        for i, label in enumerate(PROMPT_LABELS):
            n = self.arrived_by_prompt[i]
            if not n:
                continue
            done = self.completed_by_prompt[i]
            met = self.met_by_prompt[i]
            out[label] = {
                "requests": n, "completed": done, "sla_met": met, "sla_attainment": met / n,
                "sla_attainment_completed": met / done if done else None,
            }
        return out

    def predictor_summary(self) -> dict[str, Any]:
        h = self.pred_error
        out = h.summary()
        out["under_predicted"] = self.under_predicted / h.count if h.count else None
        return out

    def summary(self, gpu_seconds: float) -> dict[str, Any]:
        n = self.requests
        return {
            "weight": self.weight,
            "requests": n,
            "completed": self.completed,
            "rejected": self.rejected,
            "timed_out": self.timed_out,
            "failed": self.failed,
            "unfinished": self.unfinished,
            "rejected_by_reason": dict(sorted(self.rejected_by_reason.items())),
            "queued_by_reason": dict(sorted(self.queued_by_reason.items())),
            "timed_out_by_reason": dict(sorted(self.timed_out_by_reason.items())),
            "acceptance": self.admitted / n if n else None,
            "queued_fraction": self.queued / n if n else None,
            "timeout_rate": self.timed_out / n if n else None,
            "sla_met": self.sla_met,
            "sla_attainment": self.sla_met / n if n else None,
            "sla_attainment_completed": self.sla_met / self.completed if self.completed else None,
            "sla_by_prompt": self.by_prompt(),
            "goodput_tokens_per_gpu_s": self.tokens_met / gpu_seconds if gpu_seconds else 0.0,
            "tokens_completed": self.tokens_completed,
            "latency_s": self.latency.summary(),
            "queue_wait_s": self.wait.summary(),
            "ttft_s": self.ttft.summary(),
            "predictor_error": self.predictor_summary(),
            "retry_after_s": self.retry_hint.summary(),
            "refusals_without_hint": self.final_refusals,
            "core_preemptions": self.core_preemptions,
            "engine_preemptions": self.engine_preemptions,
            "preemption_rate": (
                (self.core_preemptions + self.engine_preemptions) / self.admitted
                if self.admitted else 0.0
            ),
            "recompute_tokens_core": self.recompute_core,
            "recompute_tokens_engine": self.recompute_engine,
        }


def combine(stats: list[TenantStats], series: TimeSeries) -> TenantStats:
    """The overall row: sums of every tenant's counters and histograms."""
    total = TenantStats("all", 1.0, series)
    for s in stats:
        for name in (
            "requests", "admitted", "queued", "completed", "rejected", "timed_out", "failed",
            "unfinished", "sla_met", "tokens_met", "tokens_completed", "core_preemptions",
            "engine_preemptions", "recompute_core", "recompute_engine", "under_predicted",
            "final_refusals",
        ):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        for mine, theirs in (
            (total.rejected_by_reason, s.rejected_by_reason),
            (total.queued_by_reason, s.queued_by_reason),
            (total.timed_out_by_reason, s.timed_out_by_reason),
        ):
            for reason, n in theirs.items():
                mine[reason] = mine.get(reason, 0) + n
        for i in range(NPROMPT):
            total.arrived_by_prompt[i] += s.arrived_by_prompt[i]
            total.completed_by_prompt[i] += s.completed_by_prompt[i]
            total.met_by_prompt[i] += s.met_by_prompt[i]
        total.latency.merge(s.latency)
        total.wait.merge(s.wait)
        total.ttft.merge(s.ttft)
        total.pred_error.merge(s.pred_error)
        total.retry_hint.merge(s.retry_hint)
    return total


def weighted_sla(stats: list[TenantStats]) -> float | None:
    """Weight-normalized SLA attainment: sum of weight x attainment / sum of weights,
    over the tenants that sent requests (None: none did)."""
    num = 0.0
    den = 0.0
    for s in stats:
        if s.requests:
            num += s.weight * s.sla_met / s.requests
            den += s.weight
    return num / den if den > 0 else None
