"""Per-request records of a simulated run, through the simulator's decision probe.

SimResult keeps histograms and counters (memory that does not grow with the run);
some claims need per-request facts: the p99 of the *same* requests alone on an
idle GPU, tokens admitted per tenant in 20 s windows by arrival time, whether an
admitted request then missed its SLA. `record` runs one policy with a probe that
keeps one small record per request (a few hundred bytes; fine for the 10^5
requests of an experiment) and returns them beside the usual SimResult.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from triage.admission.decision import Decision
from triage.sim.compare import PolicyLike, resolve
from triage.sim.engine import Simulator
from triage.sim.result import SimResult
from triage.sim.scenario import Scenario
from triage.sim.workload import Arrival
from triage.topics.reasons import Outcome, reply_status


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request."""

    tenant: str
    model: str
    arrived: float
    prompt: int
    output: int  # tokens it really generates
    max_tokens: int
    sla_s: float
    charged: float | None = None  # tokens the gate counted (prompt + expected output)
    admitted_at: float | None = None  # first dispatch to a GPU
    outcome: str = ""  # completed | failed | rejected | timed_out ("" if the probe missed it)
    latency_s: float | None = None  # arrival to completion
    preemptions: int = 0

    @property
    def admitted(self) -> bool:
        return self.admitted_at is not None

    @property
    def met(self) -> bool:
        return (
            self.outcome == "completed" and self.latency_s is not None
            and self.latency_s <= self.sla_s + 1e-9
        )

    @property
    def late(self) -> bool:
        """Admitted, then missed its SLA (finished late or failed)."""
        return self.admitted and not self.met


class Recorder:
    """The probe: records arrivals (by wrapping the stream) and decisions."""

    def __init__(self, sla_s: dict[str, float]) -> None:
        self.records: dict[str, RequestRecord] = {}
        self._sla = sla_s

    def wrap(self, arrivals: Iterable[Arrival]) -> Iterator[Arrival]:
        for i, a in enumerate(arrivals):
            rid = a.request_id or f"r{i + 1}"
            self.records[rid] = RequestRecord(
                a.tenant, a.model, a.t, a.prompt_tokens, a.output_tokens, a.max_tokens,
                a.sla_s if a.sla_s is not None else self._sla[a.tenant],
            )
            yield a if a.request_id else a.replace(request_id=rid)

    def on_decisions(self, decisions: list[Decision], now: float) -> None:
        recs = self.records
        for d in decisions:
            r = recs.get(d.request_id)
            if r is None:
                continue
            if r.charged is None and d.request_tokens is not None:
                r.charged = d.request_tokens
            o = d.outcome
            if o is Outcome.ACCEPT:
                if r.admitted_at is None:
                    r.admitted_at = d.at
            elif o is Outcome.COMPLETE or o is Outcome.REJECT or o is Outcome.TIMEOUT:
                r.outcome = reply_status(o, d.reason).value  # completed, failed, ...
                if o is Outcome.COMPLETE:
                    r.latency_s = d.latency_s
            elif o is Outcome.PREEMPT:
                r.preemptions += 1


def record(scenario: Scenario, policy: PolicyLike) -> tuple[SimResult, list[RequestRecord]]:
    """Simulate `scenario` under `policy`, keeping one record per request (arrival order)."""
    name, pc = resolve(scenario, policy)
    rec = Recorder({t.name: t.sla_ms / 1000.0 for t in scenario.config.tenants})
    sim = Simulator(
        scenario.config, rec.wrap(scenario.arrivals()), policy=pc, options=scenario.options(),
        scenario=scenario.name, policy_name=name, on_decisions=rec.on_decisions,
    )
    result = sim.run()
    return result, list(rec.records.values())


def isolated_latency_s(scenario: Scenario, r: RequestRecord) -> float:
    """The request alone on an idle GPU of its pool, in the simulator's timing model
    without noise: its prefill, then one decode step per output token at batch size 1."""
    cfg = scenario.config
    m = cfg.model(r.model)
    assert m is not None
    speed = cfg.gpu_type(cfg.pool(m.pool).gpu_type).speed
    return (r.prompt * m.prefill_s_per_token + r.output * m.decode_s_per_token) / speed


def quantile(xs: list[float], q: float) -> float | None:
    """The q-quantile of xs (nearest rank); None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))
    return s[k]


def window_sums(
    times: Iterable[float], values: Iterable[float], *, end: float, width: float, step: float = 1.0
) -> list[float]:
    """Sums of `values` over sliding windows [t, t + width), t = 0, step, ..., end - width."""
    n = max(1, math.ceil(end / step))
    bins = [0.0] * n
    for t, v in zip(times, values, strict=True):
        i = int(t / step)
        if 0 <= i < n:
            bins[i] += v
    k = max(1, round(width / step))
    if n < k:
        return [sum(bins)]
    out = []
    acc = sum(bins[:k])
    out.append(acc)
    for i in range(k, n):
        acc += bins[i] - bins[i - k]
        out.append(acc)
    return out
