"""PoolQueue.behind remembers what it found until the lane changes in a way that could
change the answer (a dispatch pass looks behind every blocked head on every pass). Over
random pushes, removals and requeues, in every queue order, it must answer what a fresh
look at the lane answers: the next live requests after the head, in lane order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from triage.admission.pending import Pending
from triage.admission.policy import ORDER_DEADLINE, ORDER_FAIR, ORDER_FIFO
from triage.admission.queue import PoolQueue

TENANTS = ("a", "b", "c")

op = st.one_of(
    st.tuples(st.just("push"), st.sampled_from(TENANTS), st.integers(0, 2),
              st.integers(0, 40)),
    st.tuples(st.just("remove"), st.integers(0, 1000)),
    st.tuples(st.just("requeue"), st.integers(0, 1000)),
    st.tuples(st.just("behind"), st.sampled_from(TENANTS)),
)


def _reference(q: PoolQueue, order: int, head: Pending, n: int) -> list[Pending]:
    lane = [p for p in q.members.values() if order != ORDER_FAIR or p.tenant == head.tenant]
    if order == ORDER_FIFO:
        lane.sort(key=lambda p: p.seq)
    else:
        lane.sort(key=lambda p: (p.cls, p.deadline, p.seq))
    assert lane[0] is head
    return lane[1:n + 1]


@settings(max_examples=300, deadline=None)
@given(order=st.sampled_from([ORDER_FAIR, ORDER_FIFO, ORDER_DEADLINE]),
       n=st.integers(1, 4), ops=st.lists(op, max_size=80))
def test_behind_answers_what_a_fresh_look_at_the_lane_answers(
    order: int, n: int, ops: list[tuple[object, ...]],
) -> None:
    q = PoolQueue(max_size=10_000, tenant_limits={}, order=order)
    seq = 0
    for o in ops:
        kind = o[0]
        if kind == "push":
            _, tenant, cls, deadline = o
            seq += 1
            p = Pending(f"r{seq}", str(tenant), "m", "p", 10, 10, 0.0, float(deadline))
            p.cls, p.seq = int(cls), seq  # type: ignore[call-overload]
            q.push(p, 0.0, 1.0)
        elif kind in ("remove", "requeue") and q.members:
            members = list(q.members.values())
            p = members[int(o[1]) % len(members)]  # type: ignore[call-overload]
            q.remove(p, 0.0, 1.0)
            if kind == "requeue":  # back in line under a new seq (a preemption)
                seq += 1
                p.seq = seq
                q.push(p, 0.0, 1.0)
        elif kind == "behind":
            tenant = o[1]
            key = "" if order != ORDER_FAIR else tenant
            head = q._lane_head(str(key))
            if head is None:
                continue
            got = q.behind(head, n)
            assert got == _reference(q, order, head, n)
            assert q.behind(head, n) == got


def test_a_later_arrival_keeps_the_answer_and_an_earlier_one_changes_it() -> None:
    """The case the memory is for: arrivals with later deadlines land behind the answer
    and leave it standing; one with an earlier deadline is in it."""
    q = PoolQueue(max_size=100, tenant_limits={})
    made = [Pending(f"r{i}", "a", "m", "p", 10, 10, 0.0, float(10 + i)) for i in range(6)]
    for i, p in enumerate(made[:4], start=1):
        p.seq = i
        q.push(p, 0.0, 1.0)
    head = made[0]
    first = q.behind(head, 2)
    assert first == made[1:3]
    late = made[5]
    late.seq = 5
    q.push(late, 0.0, 1.0)
    assert q.behind(head, 2) is first  # remembered
    early = Pending("early", "a", "m", "p", 10, 10, 0.0, 10.5)
    early.seq = 6
    q.push(early, 0.0, 1.0)
    assert q.behind(head, 2) == [early, made[1]]
    q.remove(early, 0.0, 1.0)
    assert q.behind(head, 2) == made[1:3]
