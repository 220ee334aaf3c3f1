"""The bookkeeping of an incremental fetch session (triage/streams/fetch_sessions.py),
without a broker: what each request names, and how answers move the session."""

from __future__ import annotations

from typing import Any

from aiokafka.protocol.fetch import FetchRequest, FetchRequest_v11, FetchResponse_v11
from aiokafka.structs import TopicPartition

from triage.streams.fetch_sessions import FetchSession, SessionFetchRequest

TP = TopicPartition


def _base(offsets: dict[TopicPartition, int]) -> FetchRequest:
    topics: dict[str, list[tuple[int, int, int]]] = {}
    for tp, off in offsets.items():
        topics.setdefault(tp.topic, []).append((tp.partition, off, 1024))
    return FetchRequest(20, 1, 1 << 20, 0, list(topics.items()))


def _named(req: SessionFetchRequest) -> set[tuple[str, int, int]]:
    struct = req.build(FetchRequest_v11)
    return {(t, p[0], p[2]) for t, parts in struct.topics for p in parts}


def _answer(session: FetchSession, req: SessionFetchRequest, error: int = 0,
            session_id: int = 42) -> None:
    session.answered(req, error, session_id)


def test_the_first_fetch_is_full_and_later_ones_name_only_what_changed() -> None:
    s = FetchSession()
    offsets = {TP(f"t{i}", 0): 10 for i in range(50)}
    first = s.request(_base(offsets))
    assert len(_named(first)) == 50
    struct = first.build(FetchRequest_v11)
    assert (struct.session_id, struct.session_epoch) == (0, 0)  # open a session
    _answer(s, first)
    assert (s.session_id, s.epoch, s.opened) == (42, 1, 1)

    offsets[TP("t3", 0)] = 17  # consumed: its offset moved
    second = s.request(_base(offsets))
    assert _named(second) == {("t3", 0, 17)}
    struct = second.build(FetchRequest_v11)
    assert (struct.session_id, struct.session_epoch) == (42, 1)
    assert struct.forgotten_topics_data == []
    _answer(s, second)
    assert s.epoch == 2

    del offsets[TP("t7", 0)]  # buffered records: aiokafka leaves it out, so it is forgotten
    third = s.request(_base(offsets))
    assert _named(third) == set()
    assert third.build(FetchRequest_v11).forgotten_topics_data == [("t7", [0])]
    _answer(s, third)
    offsets[TP("t7", 0)] = 30  # consumed: back, at its new offset
    fourth = s.request(_base(offsets))
    assert _named(fourth) == {("t7", 0, 30)}
    _answer(s, fourth)
    del offsets[TP("t9", 0)]  # one leaves as another joins: as many wanted as held
    offsets[TP("u1", 0)] = 5
    fifth = s.request(_base(offsets))
    assert _named(fifth) == {("u1", 0, 5)}
    assert fifth.build(FetchRequest_v11).forgotten_topics_data == [("t9", [0])]


def test_an_error_or_a_lost_answer_starts_over_with_a_full_fetch() -> None:
    s = FetchSession()
    offsets = {TP("a", 0): 1, TP("b", 0): 2}
    _answer(s, s.request(_base(offsets)))
    req = s.request(_base(offsets))
    _answer(s, req, error=71)  # INVALID_FETCH_SESSION_EPOCH
    assert (s.session_id, s.epoch, s.parts) == (0, 0, {})
    assert len(_named(s.request(_base(offsets)))) == 2
    s.reset()  # what a failed or cancelled send does
    again = s.request(_base(offsets))
    assert again.build(FetchRequest_v11).session_id == 0 and len(_named(again)) == 2


def test_a_broker_that_declines_a_session_gets_full_fetches() -> None:
    s = FetchSession()
    offsets = {TP("a", 0): 1, TP("b", 0): 2}
    _answer(s, s.request(_base(offsets)), session_id=0)
    assert (s.session_id, s.opened) == (0, 0)
    assert len(_named(s.request(_base(offsets)))) == 2


def test_the_response_is_matched_to_the_offsets_asked_for_and_nothing_else() -> None:
    s = FetchSession()
    offsets = {TP("a", 0): 5, TP("b", 0): 9}
    req = s.request(_base(offsets))
    part: Any = (0, 0, 100, 100, 0, [], -1, b"")
    resp = FetchResponse_v11(0, 0, 42, [("a", [part]), ("zzz", [part])])
    base = _base(offsets)
    req = s.request(base)
    req.matched(resp)
    assert base.topics == [("a", [(0, 5, 1024)])]  # what aiokafka looks the offset up in
    assert [t for t, _ in resp.topics] == ["a"]  # a partition never asked for is dropped
