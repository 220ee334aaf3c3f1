"""The outbox's two lanes (streams/lanes.py): a batch's work outputs commit first, its
replies after, possibly with later batches' replies in one transaction. What must hold:
each output is re-sent after a crash exactly when its own lane had not committed its
batch, and the committer never lets Faust commit offsets past replies still owed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import pytest
from _core_factory import config, tenant
from prometheus_client import CollectorRegistry

from triage.streams import committer as committer_module
from triage.streams.committer import Committer
from triage.streams.health import Health
from triage.streams.lanes import Committed, MarksState, TxnLane
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import (
    BatchedOutbox,
    Lane,
    ListOutbox,
    OutboxFencedError,
    OutboxStoppedError,
    Output,
)
from triage.streams.service import AdmissionService
from triage.streams.store import MappingStore
from triage.topics.messages import DecisionRecord, InferenceRequest, Reply
from triage.topics.names import TopicNames
from triage.topics.reasons import ReplyStatus

NAMES = TopicNames("t")
REPLIES = "t.replies.a"
WORK = "t.gpu.g0.work"


def is_reply(topic: str) -> bool:
    return topic == NAMES.decisions or topic.startswith("t.replies.")


# --- bookkeeping ----------------------------------------------------------------------
def test_a_batch_splits_into_its_work_and_its_replies_in_order() -> None:
    out = BatchedOutbox(is_reply)
    for topic, value in ((WORK, b"w1"), (REPLIES, b"r1"), (NAMES.decisions, b"d1"),
                         (WORK, b"w2"), (REPLIES, b"r2")):
        out.send_raw(topic, b"k", value)
    _seq, batch = out.seal()
    work, replies = out.split(batch)
    assert [o[2] for o in work] == [b"w1", b"w2"]
    assert [o[2] for o in replies] == [b"r1", b"d1", b"r2"]
    assert BatchedOutbox().split(batch) == (batch, [])  # one lane: everything is work


def test_replay_sends_each_output_whose_own_lane_did_not_commit_its_batch() -> None:
    out = BatchedOutbox(is_reply)
    outputs = [(7, WORK, b"w7"), (7, REPLIES, b"r7"), (8, WORK, b"w8"), (8, REPLIES, b"r8")]
    assert out.replay("k", outputs, Committed(work=8, replies=7)) == 1
    _seq, batch = out.seal()
    assert [(o[0], o[2]) for o in batch] == [(REPLIES, b"r8")]
    assert out.replay("k", outputs, 6) == 4  # a bare number: both lanes


def test_outputs_travel_with_records_until_both_lanes_committed_them() -> None:
    out = BatchedOutbox(is_reply)
    out.send_raw(WORK, b"k", b"w")
    out.send_raw(REPLIES, b"k", b"r")
    seq, _ = out.seal()
    out.confirm(seq, replies=False)
    assert out.lane_confirmed == Committed(seq, 0) and out.confirmed == 0
    assert len(out.pending_for("k")) == 2  # the reply is still owed
    out.confirm(seq, work=False)
    assert out.confirmed == seq and out.pending_for("k") == []


def test_a_restart_numbers_new_batches_above_both_lanes() -> None:
    out = BatchedOutbox(is_reply)
    out.resume_after(Committed(work=12, replies=9), highest_seen=10)
    assert out.seq == 13 and out.confirmed == 9 and out.lane_confirmed == Committed(12, 9)


def test_an_empty_reply_lane_beside_a_one_lane_writers_marks_owes_nothing() -> None:
    """Upgrading from one lane: the old writer's batches held their replies."""
    old_work = MarksState(seq=40, writer="x", open=False, lanes=1)
    empty = MarksState(seq=0, writer=None, open=False)
    assert Committed.read(old_work, empty) == Committed(40, 40)
    # a two-lane writer that died before its first reply transaction owes them all
    new_work = MarksState(seq=3, writer="x", open=False, lanes=2)
    assert Committed.read(new_work, empty) == Committed(3, 0)
    assert Committed.read(new_work, MarksState(2, "x.replies", False, 2)) == Committed(3, 2)
    assert Committed.read(old_work, None) == Committed(40, 40)  # a one-lane outbox


# --- the service over a crash between the lanes ------------------------------------------
def _boot(store: MappingStore, committed: int | Committed = 0
          ) -> tuple[AdmissionService, ListOutbox]:
    cfg = config(tenants=[tenant("a")], gpus=1, kv_budget_gib=0.2)
    out = ListOutbox(is_reply)
    out.resume_after(committed)
    svc = AdmissionService(cfg, names=NAMES, outbox=out, store=store,
                           metrics=AdmissionMetrics(CollectorRegistry()), expect_heartbeats=False)
    svc.restore(0.0)
    return svc, out


def _send(svc: AdmissionService, rid: str) -> None:
    value = InferenceRequest(request_id=rid, tenant="a", model="m8", prompt_tokens=500,
                             max_tokens=100, prompt="hello").to_bytes()
    svc.on_request(topic="t.requests.a", key=rid.encode(), value=value, partition=0,
                   offset=0, now=1.0)


def _on(out: ListOutbox, topic: str) -> list[bytes]:
    return [v for t, _, v in out.published if t == topic]


def test_a_crash_between_the_lanes_resends_the_replies_and_not_the_work() -> None:
    store = MappingStore.in_memory()
    svc, out = _boot(store)
    _send(svc, "r1")  # accepted: its work item, its reply and its decision record
    seq = out.commit(replies=False)  # the work lane committed; then kill -9
    assert len(_on(out, WORK)) == 1 and _on(out, REPLIES) == []
    _, out2 = _boot(store, Committed(work=seq, replies=seq - 1))
    out2.commit()
    assert _on(out2, WORK) == []  # the GPU has it already: never dispatched twice
    assert [Reply.from_bytes(v).status for v in _on(out2, REPLIES)] == [ReplyStatus.ACCEPTED]
    (rec,) = [DecisionRecord.from_bytes(v) for v in _on(out2, NAMES.decisions)]
    assert rec.request_id == "r1"
    _, out3 = _boot(store, Committed(seq, seq))  # both lanes out: nothing again
    out3.commit()
    assert out3.published == []


# --- the committer ------------------------------------------------------------------------
class _Outbox(BatchedOutbox):
    """Records each transaction instead of sending it."""

    def __init__(self) -> None:
        super().__init__(is_reply)
        self.replies: object | None = object()  # a reply lane exists
        self.stopping = False
        self.txns: list[tuple[str, int, list[bytes]]] = []
        self.marked: list[tuple[str, int, set[int]]] = []  # the shards each one marked
        self.mark_partitions: set[int] = {0}
        self.fail_replies = False

    def publish(self, seq: int, batch: list[Output], lane: Lane = "work",
                still_member: Callable[[], bool] | None = None,
                marks: Collection[int] | None = None) -> None:
        if still_member is not None and not still_member():
            raise OutboxFencedError(f"batch {seq}")
        if lane == "replies" and self.fail_replies:
            raise OutboxStoppedError("stopped")
        self.txns.append((lane, seq, [o[2] for o in batch]))
        self.marked.append((lane, seq, set(self.mark_partitions if marks is None else marks)))


class _Producer:
    async def flush(self) -> None:
        return None


class _App:
    def __init__(self) -> None:
        self.producer = _Producer()


class _Changelog:
    def pending(self) -> int:
        return 0

    def persist_offsets(self) -> None:
        return None


@pytest.fixture
def split_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch's replies on the reply lane, however few (as at 1,000 tenants)."""
    monkeypatch.setattr(committer_module, "COMBINE_MAX_PARTITIONS", 0)


def _committer() -> tuple[Committer, _Outbox]:
    out = _Outbox()
    committer = Committer(_App(), out, Health(), _Changelog())  # type: ignore[arg-type]
    committer.install()
    return committer, out


def _stage(out: _Outbox, n: int) -> None:
    out.send_raw(WORK, b"k", f"w{n}".encode())
    out.send_raw(REPLIES, b"k", f"r{n}".encode())


def test_the_commit_loop_commits_work_and_leaves_replies_to_the_reply_lane(
    split_always: None,
) -> None:
    async def run() -> tuple[list[Any], Committed, list[Any], Committed]:
        committer, out = _committer()
        _stage(out, 1)
        await committer.drain(replies=False)
        _stage(out, 2)
        await committer.drain(replies=False)
        before = (list(out.txns), out.lane_confirmed)
        await committer.commit_replies()  # both batches' replies in one transaction
        return before[0], before[1], out.txns, out.lane_confirmed

    work_only, mid, txns, end = asyncio.run(run())
    assert work_only == [("work", 1, [b"w1"]), ("work", 2, [b"w2"])]
    assert mid == Committed(2, 0)
    assert txns[2:] == [("replies", 2, [b"r1", b"r2"])]
    assert end == Committed(2, 2)


def test_fausts_flush_returns_only_once_both_lanes_are_out(split_always: None) -> None:
    """Faust commits input offsets right after its producer's flush (the committer's
    drain): a reply still queued then would be lost in a crash."""
    async def run() -> tuple[Committed, list[Any]]:
        committer, out = _committer()
        _stage(out, 1)
        await committer.drain(replies=False)
        _stage(out, 2)
        await committer.app.producer.flush()
        return out.lane_confirmed, out.txns

    confirmed, txns = asyncio.run(run())
    assert confirmed == Committed(2, 2)
    assert [t[0] for t in txns] == ["work", "work", "replies"]


def test_replies_a_failed_transaction_held_go_out_next_time_in_order(split_always: None) -> None:
    async def run() -> tuple[list[Any], Committed]:
        committer, out = _committer()
        _stage(out, 1)
        await committer.drain(replies=False)
        out.fail_replies = True
        with pytest.raises(OutboxStoppedError):
            await committer.commit_replies()
        out.fail_replies = False
        _stage(out, 2)
        await committer.drain()
        return out.txns, out.lane_confirmed

    txns, confirmed = asyncio.run(run())
    assert txns[-1] == ("replies", 2, [b"r1", b"r2"]) and confirmed == Committed(2, 2)


def test_few_replies_ride_with_their_work_only_while_the_reply_lane_is_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A few tenants: one transaction per batch, as with one lane. Many: the reply lane.
    A batch that could ride while earlier replies are still queued must not: its
    replies would overtake theirs."""
    monkeypatch.setattr(committer_module, "COMBINE_MAX_PARTITIONS", 1)

    async def run() -> tuple[list[Any], Committed]:
        committer, out = _committer()
        _stage(out, 1)
        await committer.drain(replies=False)  # one reply partition: rides
        out.send_raw(WORK, b"k", b"w2")
        out.send_raw(REPLIES, b"k", b"r2")
        out.send_raw("t.replies.b", b"k", b"r2b")  # two partitions: the reply lane
        await committer.drain(replies=False)
        _stage(out, 3)  # few again, but batch 2's replies are still queued
        await committer.drain(replies=False)
        await committer.commit_replies()
        _stage(out, 4)  # the lane is idle again
        await committer.drain(replies=False)
        return out.txns, out.lane_confirmed

    txns, confirmed = asyncio.run(run())
    assert txns == [("both", 1, [b"w1", b"r1"]), ("work", 2, [b"w2"]), ("work", 3, [b"w3"]),
                    ("replies", 3, [b"r2", b"r2b", b"r3"]), ("both", 4, [b"w4", b"r4"])]
    assert confirmed == Committed(4, 4)


def test_the_reply_loop_retries_what_a_failed_transaction_left_queued(
    split_always: None,
) -> None:
    """The loop wakes when a batch queues replies; after a failed transaction it must try
    again by itself, not wait for a next batch that may never come (an idle app)."""
    async def run() -> tuple[list[Any], Committed]:
        committer, out = _committer()
        out.fail_replies = True
        loop = asyncio.ensure_future(committer_module._commit_replies_continuously(
            committer, out))  # type: ignore[arg-type]
        _stage(out, 1)
        await committer.drain(replies=False)
        for _ in range(3):  # at least one failed try
            await asyncio.sleep(committer_module.CYCLE_S)
        out.fail_replies = False  # the broker is back; no new batch comes
        for _ in range(100):
            if out.lane_confirmed.replies == 1:
                break
            await asyncio.sleep(committer_module.CYCLE_S)
        out.stopping = True
        loop.cancel()
        return out.txns, out.lane_confirmed

    txns, confirmed = asyncio.run(run())
    assert txns[-1] == ("replies", 1, [b"r1"]) and confirmed == Committed(1, 1)


def test_replies_ride_with_their_work_only_when_they_touch_few_partitions() -> None:
    """combine() counts the partitions a batch's replies touch: explicit ones as named,
    keyed ones (partition -1) on partition 0 of one-partition topics, and each distinct
    key, up to the topic's partitions, on wider ones."""
    combine = committer_module.combine
    limit = committer_module.COMBINE_MAX_PARTITIONS

    def keyed(topic: str, key: str) -> Any:
        return (topic, key.encode(), b"{}", -1, None)

    one_tenant = [keyed("triage.replies.a", f"r{i}") for i in range(100)]
    assert combine(one_tenant)  # one partition, however many keys
    assert not combine(one_tenant, partitions_per_topic=limit + 1)  # keys spread out
    assert combine(one_tenant, partitions_per_topic=limit)  # at most every partition
    many = [keyed(f"triage.replies.t{i}", "r") for i in range(limit + 1)]
    assert not combine(many)
    assert combine(many[:limit])
    named = [("triage.replies.a", b"r", b"{}", i % 2, None) for i in range(50)]
    assert combine(named, partitions_per_topic=2)


def test_each_lane_asks_its_send_check_and_a_lapsed_one_exits_sending_nothing(
    split_always: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The committer asks the guard right before each hand-off and gives the outbox a
    check made then (lapse.py, SendCheck) on both lanes. A check that says the group
    went on without this process ends it as a zombie, with the batch not committed."""
    exits: list[str] = []

    def exit_as_zombie(why: str) -> None:
        exits.append(why)
        raise SystemExit(75)

    monkeypatch.setattr(committer_module, "exit_as_zombie", exit_as_zombie)
    events: list[str] = []
    listed = [True]

    async def deciding() -> bool:
        events.append("deciding")
        return True

    def send_check() -> Any:
        events.append("check made")
        return lambda: listed[0]

    async def run() -> tuple[list[Any], Committed]:
        committer, out = _committer()
        committer.deciding, committer.send_check = deciding, send_check
        _stage(out, 1)
        await committer.drain()  # work, then replies: each made its own check
        listed[0] = False
        _stage(out, 2)
        with pytest.raises(SystemExit):
            await committer.drain()
        return out.txns, out.lane_confirmed

    txns, confirmed = asyncio.run(run())
    assert [t[:2] for t in txns] == [("work", 1), ("replies", 1)]
    assert events[:6] == ["deciding", "deciding", "check made"] * 2
    assert confirmed == Committed(1, 1) and len(exits) == 1


def test_a_takeover_reads_the_marks_only_while_its_own_lane_holds_no_transaction() -> None:
    """A shard adopted again after a missed rebalance may still be in this lane's marks:
    read while the lane's own batch is open, the marks name a batch before it as the last
    committed, and the batch would be sent twice (replayed here, then committed). So the
    takeover waits for the lane's transaction lock."""
    lane = TxnLane("127.0.0.1:1", transactional_id="t.outbox.i0", marks_topic="t.marks",
                   retry=lambda _what, fn: fn())
    read_while_busy: list[bool] = []

    def last_marker(_partition: int) -> MarksState:
        read_while_busy.append(in_flight.is_set())
        return MarksState(7, "t.outbox.i0", False)

    lane.last_marker = last_marker  # type: ignore[method-assign]
    in_flight = threading.Event()

    def a_batch_in_flight() -> None:
        with lane.busy:
            in_flight.set()
            time.sleep(0.3)
            in_flight.clear()

    batch = threading.Thread(target=a_batch_in_flight)
    batch.start()
    assert in_flight.wait(5)
    assert lane.take_over(0).seq == 7
    batch.join(5)
    assert read_while_busy == [False]


def test_a_batch_marks_the_shards_owned_when_it_was_sealed(split_always: None) -> None:
    """A shard adopted while a sealed batch waits for its changelog flush has its replayed
    outputs staged in a later batch. Marked by the earlier one as well, a crash between
    the two commits left the shard's next owner reading those outputs as committed (the
    earlier batch's number can lie above theirs): they were never sent."""
    committer, out = _committer()

    async def adopt_during_the_flush() -> None:
        out.mark_partitions.add(1)  # the rebalance callback runs at this await

    committer._faust_flush = adopt_during_the_flush

    async def run() -> None:
        _stage(out, 1)
        await committer.drain(replies=False)
        committer._faust_flush = _Producer().flush
        _stage(out, 2)
        await committer.drain()

    asyncio.run(run())
    assert out.marked == [("work", 1, {0}), ("work", 2, {0, 1}), ("replies", 2, {0, 1})]
