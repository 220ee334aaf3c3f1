"""Property tests of the whole core over random event sequences: conservation, the KV
budget and floors, queue bounds, queue exits on time, and deterministic replay."""

from __future__ import annotations

from dataclasses import dataclass

from _core_factory import config, model, tenant
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.admission.core import AdmissionCore
from triage.admission.decision import Decision
from triage.topics.reasons import Outcome

TICK = 0.05
LEAVES = (Outcome.ACCEPT, Outcome.TIMEOUT, Outcome.COMPLETE, Outcome.REJECT)
POLICIES = ["full", "admit_all", "reject_only", "rate_limit_only", "bounded_queue"]


@dataclass(frozen=True)
class Submit:
    tenant: str
    model: str
    prompt: int
    max_tokens: int


@dataclass(frozen=True)
class Finish:
    pick: int  # which running request (index modulo running count)
    ok: bool


events = st.lists(
    st.tuples(
        st.floats(0.0, 0.4),
        st.one_of(
            st.builds(Submit, st.sampled_from(["a", "b", "vip"]), st.sampled_from(["m8", "m70"]),
                      st.integers(1, 1500), st.integers(1, 1000)),
            st.builds(Finish, st.integers(0, 1000), st.booleans()),
        ),
    ),
    min_size=30,
    max_size=150,
)


def _core(policy: str) -> AdmissionCore:
    cfg = config(
        tenants=[
            tenant("a", rate_tokens_per_s=3000, burst_tokens=8000, max_debt_tokens=4000,
                   queue_max=6, max_queue_wait_ms=700, sla_ms=20_000, weight=2.0),
            tenant("b", rate_tokens_per_s=2000, burst_tokens=6000, allow_overage=True,
                   queue_max=4, max_queue_wait_ms=1500, sla_ms=60_000, max_concurrency=3),
            tenant("vip", queue_max=3, max_queue_wait_ms=300, sla_ms=8_000,
                   reserved_kv_share=0.2),
        ],
        models=[model("m8", reserved_kv_gib_per_gpu=0.1),
                model("m70", layers=80, reserved_kv_gib_per_gpu=0.15, decode_s_per_token=0.03)],
        gpus=3, kv_budget_gib=1.0, queue_max=10, policy={"preset": policy},
        hysteresis={"low": 0.4, "high": 0.6, "hold_s": 0.5, "relax_after_s": 1.0,
                    "autoscale_after_s": 1.0},
    )
    return AdmissionCore(cfg)


def _drive(policy: str, evs: list[tuple[float, object]]) -> tuple[list[Decision], AdmissionCore]:
    """Run the events with a tick every TICK seconds, checking invariants after each step."""
    core = _core(policy)
    d = core.dispatchers["p"]
    flags = core.flags
    out: list[Decision] = []
    now = 0.0
    next_tick = TICK
    n = 0
    queued_expiry: dict[str, float] = {}

    def check(step_out: list[Decision]) -> None:
        out.extend(step_out)
        for x in step_out:
            if x.outcome is Outcome.QUEUE or x.outcome is Outcome.PREEMPT:
                queued_expiry[x.request_id] = d.queue.members[x.request_id].expires_at
            elif x.request_id in queued_expiry and x.outcome in LEAVES:
                # left the queue no later than its expiry plus one tick
                assert x.at <= queued_expiry.pop(x.request_id) + TICK + 1e-9
        # KV budget and floors (only where the policy keeps the ledger)
        if flags.memory_fit:
            for s in d.ledger.slots:
                assert s.used <= s.budget
                assert s.floors_hold()
        # queue bounds
        assert len(d.queue) <= d.settings.queue_max
        for t, c in d.queue.tenant_count.items():
            assert c <= d.settings.tenant_queue_max[t]
        if not flags.queue:
            assert len(d.queue) == 0

    for dt, ev in evs:
        now += dt
        while next_tick <= now:
            check(core.tick(next_tick))
            next_tick += TICK
        if isinstance(ev, Submit):
            n += 1
            check(core.submit(f"r{n}", ev.tenant, ev.model, ev.prompt, ev.max_tokens, now))
        elif isinstance(ev, Finish) and d.inflight:
            running = sorted(d.inflight.values(), key=lambda p: p.seq)
            p = running[ev.pick % len(running)]
            check(core.complete(pool="p", request_id=p.request_id, attempt=p.attempt, ok=ev.ok,
                                output_tokens=int(p.expected_out), prefill_s=0.01,
                                decode_s=0.2, concurrency=float(p.gpu.running), now=now))  # type: ignore[attr-defined]
    # drain: finish everything and tick past every wait, on the same tick grid (a drain
    # step off the grid would leave a gap longer than a tick between two ticks)
    for _ in range(400):
        if not d.inflight and not len(d.queue):
            break
        now = next_tick
        next_tick += TICK
        for p in sorted(d.inflight.values(), key=lambda p: p.seq):
            check(core.complete(pool="p", request_id=p.request_id, attempt=p.attempt, ok=True,
                                output_tokens=1, prefill_s=0.01, decode_s=0.1, concurrency=1.0,
                                now=now))
        check(core.tick(now))
    return out, core


def _terminal_counts(decisions: list[Decision]) -> dict[str, int]:
    ends: dict[str, int] = {}
    for x in decisions:
        if x.outcome in (Outcome.COMPLETE, Outcome.REJECT, Outcome.TIMEOUT):
            ends[x.request_id] = ends.get(x.request_id, 0) + 1
    return ends


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(POLICIES), evs=events)
def test_invariants_and_conservation(policy: str, evs: list[tuple[float, object]]) -> None:
    out, core = _drive(policy, evs)
    submitted = {f"r{i + 1}" for i in range(sum(isinstance(e, Submit) for _, e in evs))}
    ends = _terminal_counts(out)
    # every request ends exactly once
    assert set(ends) == submitted
    assert all(c == 1 for c in ends.values())
    d = core.dispatchers["p"]
    assert not d.inflight and not len(d.queue)
    if policy == "admit_all":
        assert all(x.outcome is not Outcome.REJECT for x in out)
    if policy in ("reject_only", "rate_limit_only", "admit_all"):
        assert all(x.outcome is not Outcome.QUEUE for x in out)


@settings(max_examples=25, deadline=None)
@given(policy=st.sampled_from(POLICIES), evs=events)
def test_replaying_the_same_events_gives_the_same_decisions(
    policy: str, evs: list[tuple[float, object]]
) -> None:
    first, _ = _drive(policy, evs)
    second, _ = _drive(policy, evs)
    assert first == second
