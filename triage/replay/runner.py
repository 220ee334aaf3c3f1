"""Run recorded requests through the simulator under a candidate policy.

The simulator drives the same AdmissionCore as the admission app, so this module holds no
policy: it turns recorded requests into arrivals, runs them once in virtual time, and
keeps, per request, the first decision (the answer at arrival) and the last terminal one.
Same recording, config and policy give the same decisions, run after run: the GPUs'
timing noise is off and the simulator is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

from triage.admission.decision import Decision
from triage.audit.explain import TERMINAL_OUTCOMES
from triage.config.models import PolicyConfig, TriageConfig
from triage.replay.arrivals import OutputSources, invalid_under, origin_ms, to_arrivals
from triage.replay.recording import Recording
from triage.sim.engine import SimOptions, Simulator
from triage.sim.result import SimResult
from triage.topics.reasons import Outcome


@dataclass(frozen=True, slots=True)
class ReplayRun:
    """The replayed decisions of one recording under one policy."""

    policy: str  # the candidate's name
    policy_version: str
    origin_ms: int  # epoch ms of virtual time zero
    first: dict[str, Decision]  # request id -> its first replayed decision
    final: dict[str, Decision]  # request id -> its last terminal replayed decision
    outputs: OutputSources
    simulated: int  # requests that went through the simulator
    result: SimResult | None  # the simulator's summary (None when nothing was simulated)

    def at_ms(self, d: Decision) -> int:
        """A replayed decision's time on the recording's clock."""
        return self.origin_ms + round(d.at * 1000.0)


class _Collector:
    """The simulator's decision probe. A batch can still grow after the probe sees it (the
    simulator appends a failed completion when a GPU refuses a sequence), so each batch is
    read up to its end again when the next arrives, and once more after the run."""

    def __init__(self) -> None:
        self.first: dict[str, Decision] = {}
        self.final: dict[str, Decision] = {}
        self._batch: list[Decision] = []
        self._seen = 0

    def __call__(self, decisions: list[Decision], now: float) -> None:
        self.drain()
        self._batch, self._seen = decisions, 0
        self.drain()

    def drain(self) -> None:
        batch = self._batch
        first, final = self.first, self.final
        for i in range(self._seen, len(batch)):
            d = batch[i]
            rid = d.request_id
            if rid not in first:
                first[rid] = d
            if d.outcome in TERMINAL_OUTCOMES:
                final[rid] = d
        self._seen = len(batch)


def replay(
    recording: Recording, config: TriageConfig, policy: PolicyConfig | None = None, *,
    options: SimOptions | None = None,
) -> ReplayRun:
    """Replay `recording` on `config`'s fleet and tenants under `policy` (default: the
    config's own policy)."""
    pol = policy or config.policy
    collector = _Collector()
    origin = origin_ms(recording.requests[0].arrived_ms if recording.requests else 0,
                       pol.tick_ms)
    runnable = []
    for r in recording.requests:
        bad = invalid_under(r, config)
        if bad is None:
            runnable.append(r)
            continue
        # what the app answers before any policy runs (not a policy decision)
        d = Decision(
            r.request_id, r.tenant, r.model, None, Outcome.INVALID, bad.reason,
            (r.arrived_ms - origin) / 1000.0, policy=pol.name, policy_version=pol.version,
            detail=bad.detail,
        )
        collector.first[r.request_id] = collector.final[r.request_id] = d
    arrivals, sources = to_arrivals(runnable, config, origin)
    result = None
    if arrivals:
        sim = Simulator(
            config, arrivals, policy=pol, scenario=f"replay of {recording.source}",
            options=options or SimOptions(seed=0, gpu_noise=0.0), on_decisions=collector,
        )
        result = sim.run()
        collector.drain()
    return ReplayRun(
        policy=pol.name, policy_version=pol.version, origin_ms=origin, first=collector.first,
        final=collector.final, outputs=sources, simulated=len(arrivals), result=result,
    )
