"""Recorded vs replayed, request by request, and the counts that say what would change.

Per request two things are compared: the first decision (outcome and reason: what the
tenant was told at arrival) and the final outcome (completed, failed, rejected,
timed_out, invalid, unsettled). Changes are counted per tenant, per transition of the
first decision (``reject:tenant_quota_exceeded -> accept:admitted``) and per transition
of the final outcome, with example requests whose decisions are explained with the
numbers behind them, as `triage audit` explains a recorded one. Requests with no
recorded decision are replayed but not compared (`unrecorded`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from pydantic import BaseModel, ConfigDict

from triage.admission.decision import Decision
from triage.audit.sentences import sentence
from triage.replay.recording import RecordedRequest, Recording, final_label
from triage.replay.runner import ReplayRun
from triage.streams.codec import decision_record
from triage.topics.messages import DecisionRecord
from triage.topics.reasons import Outcome, ReasonCode


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DecisionView(_Frozen):
    """One decision, explained: its sentence and the numbers it was made on."""

    outcome: Outcome
    reason: ReasonCode
    at_ms: int
    sentence: str
    numbers: dict[str, Any]


class Example(_Frozen):
    """A request whose first decision changed."""

    request_id: str
    tenant: str
    model: str
    arrived_ms: int
    recorded: DecisionView
    replayed: DecisionView
    recorded_final: str
    replayed_final: str


class Transition(_Frozen):
    """How many first decisions went from `recorded` to `replayed` (outcome:reason)."""

    recorded: str
    replayed: str
    count: int
    tenants: dict[str, int]
    examples: list[Example]


class FinalTransition(_Frozen):
    """How many requests ended `replayed` instead of `recorded`."""

    recorded: str
    replayed: str
    count: int
    tenants: dict[str, int]
    example_ids: list[str]


class TenantDiff(_Frozen):
    """One tenant's counts."""

    tenant: str
    requests: int  # replayed
    compared: int  # with a recorded first decision
    first_changed: int  # outcome or reason of the first decision differs
    outcome_changed: int  # its outcome differs (accept / queue / reject / invalid)
    final_changed: int  # the final outcome differs
    recorded_finals: dict[str, int]
    replayed_finals: dict[str, int]


class OutputTokens(_Frozen):
    """Where the simulated output token counts came from."""

    recorded: int  # a recorded completion
    learned_ratio: int  # the tenant's learned output ratio x max_tokens
    ratios: dict[str, float]


class ReplayReport(_Frozen):
    """The JSON form of `triage replay`."""

    source: str
    since_ms: int | None
    until_ms: int | None
    recorded_policies: dict[str, int]  # `name vVERSION` -> first decisions it made
    policy: str
    policy_version: str
    requests: int  # replayed
    simulated: int  # of which went through the simulator (the rest: invalid as written)
    compared: int  # with a recorded first decision
    unrecorded: int  # replayed, but no recorded decision to compare with
    first_changed: int
    outcome_changed: int
    final_changed: int
    outcome_transitions: dict[str, int]  # `reject -> accept` -> requests
    skipped: dict[str, int]  # why recorded requests were not replayed
    output_tokens: OutputTokens
    tenants: list[TenantDiff]
    transitions: list[Transition]  # of first decisions, most frequent first
    final_transitions: list[FinalTransition]

    def to_json(self, *, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)


def key(outcome: Outcome, reason: ReasonCode) -> str:
    return f"{outcome.value}:{reason.value}"


def _numbers(r: DecisionRecord) -> dict[str, Any]:
    top = {
        "gpu_id": r.gpu_id, "predicted_s": r.predicted_s, "queue_wait_ms": r.queue_wait_ms,
        "retry_after_ms": r.retry_after_ms,
    }
    return {**{k: v for k, v in top.items() if v is not None},
            **r.inputs.model_dump(exclude_none=True)}


def _view(r: DecisionRecord) -> DecisionView:
    return DecisionView(outcome=r.outcome, reason=r.reason, at_ms=r.at_ms, sentence=sentence(r),
                        numbers=_numbers(r))


def replayed_record(d: Decision, run: ReplayRun) -> DecisionRecord:
    """A replayed decision as the app would have recorded it, on the recording's clock."""
    rec = DecisionRecord.from_bytes(decision_record(d))
    return rec.model_copy(update={"at_ms": run.at_ms(d)})


def _example(r: RecordedRequest, d: Decision, fin: str, run: ReplayRun) -> Example:
    assert r.first is not None
    return Example(
        request_id=r.request_id, tenant=r.tenant, model=r.model, arrived_ms=r.arrived_ms,
        recorded=_view(r.first), replayed=_view(replayed_record(d, run)),
        recorded_final=r.recorded_final, replayed_final=fin,
    )


def _sorted(c: Counter[str]) -> dict[str, int]:
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def compare(recording: Recording, run: ReplayRun, *, examples: int = 3) -> ReplayReport:
    """The diff of `recording` and its replay `run`, with up to `examples` per transition."""
    per_tenant: dict[str, Counter[str]] = defaultdict(Counter)
    rec_finals: dict[str, Counter[str]] = defaultdict(Counter)
    rep_finals: dict[str, Counter[str]] = defaultdict(Counter)
    moves: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    move_examples: dict[tuple[str, str], list[Example]] = defaultdict(list)
    ends: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    end_ids: dict[tuple[str, str], list[str]] = defaultdict(list)
    outcome_moves: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    for r in recording.requests:
        t = r.tenant
        c = per_tenant[t]
        d = run.first.get(r.request_id)
        if d is None:  # not replayed: cannot happen for a simulated arrival
            continue
        c["requests"] += 1
        f = run.final.get(r.request_id)
        fin = final_label(f.outcome, f.reason) if f is not None else final_label(None, None)
        rep_finals[t][fin] += 1
        if r.first is None:
            c["unrecorded"] += 1
            continue
        c["compared"] += 1
        rec_fin = r.recorded_final
        rec_finals[t][rec_fin] += 1
        was, now = key(r.first.outcome, r.first.reason), key(d.outcome, d.reason)
        if was != now:
            c["first_changed"] += 1
            moves[was, now][t] += 1
            if len(move_examples[was, now]) < examples:
                move_examples[was, now].append(_example(r, d, fin, run))
            if r.first.outcome is not d.outcome:
                c["outcome_changed"] += 1
                outcome_moves[f"{r.first.outcome.value} -> {d.outcome.value}"] += 1
        if rec_fin != fin:
            c["final_changed"] += 1
            ends[rec_fin, fin][t] += 1
            if len(end_ids[rec_fin, fin]) < examples:
                end_ids[rec_fin, fin].append(r.request_id)
    for c in per_tenant.values():
        totals.update(c)
    tenants = [
        TenantDiff(
            tenant=t, requests=c["requests"], compared=c["compared"],
            first_changed=c["first_changed"], outcome_changed=c["outcome_changed"],
            final_changed=c["final_changed"], recorded_finals=_sorted(rec_finals[t]),
            replayed_finals=_sorted(rep_finals[t]),
        )
        for t, c in sorted(per_tenant.items())
    ]
    transitions = [
        Transition(recorded=was, replayed=now, count=sum(c.values()), tenants=_sorted(c),
                   examples=move_examples[was, now])
        for (was, now), c in moves.items()
    ]
    transitions.sort(key=lambda x: (-x.count, x.recorded, x.replayed))
    finals = [
        FinalTransition(recorded=was, replayed=now, count=sum(c.values()), tenants=_sorted(c),
                        example_ids=end_ids[was, now])
        for (was, now), c in ends.items()
    ]
    finals.sort(key=lambda x: (-x.count, x.recorded, x.replayed))
    out = run.outputs
    return ReplayReport(
        source=recording.source, since_ms=recording.since_ms, until_ms=recording.until_ms,
        recorded_policies=_sorted(recording.recorded_policies()), policy=run.policy,
        policy_version=run.policy_version, requests=totals["requests"],
        simulated=run.simulated, compared=totals["compared"], unrecorded=totals["unrecorded"],
        first_changed=totals["first_changed"], outcome_changed=totals["outcome_changed"],
        final_changed=totals["final_changed"], outcome_transitions=_sorted(outcome_moves),
        skipped=_sorted(recording.skipped),
        output_tokens=OutputTokens(recorded=out.recorded, learned_ratio=out.learned,
                                   ratios={t: round(v, 4) for t, v in sorted(out.ratios.items())}),
        tenants=tenants, transitions=transitions, final_transitions=finals,
    )
