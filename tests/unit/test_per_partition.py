"""Faust's per-fetch and per-timer passes over the assigned partitions, made independent
of their number (streams/per_partition.py, streams/priority.py): the same answers as
before, with less work."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from triage.streams import per_partition
from triage.streams.priority import ControlPartitions, serve_control_partitions_first

REQUESTS = re.compile(r"^p\.requests\..+$")


def _consumer(tps: list[TP]) -> Any:
    assignment = SimpleNamespace(tps=frozenset(tps))
    return SimpleNamespace(_subscription=SimpleNamespace(
        subscription=SimpleNamespace(assignment=assignment)))


def _tps(tenants: int) -> list[TP]:
    control = [TP("p.completions", 0), TP("p.admission", 0), TP("p.gpu.status", 0)]
    return control + [TP(f"p.requests.t{i}", 0) for i in range(tenants)]


def test_control_partitions_are_those_the_request_pattern_does_not_match() -> None:
    split = ControlPartitions(REQUESTS)
    tps = _tps(1000)
    consumer = _consumer(tps)
    for active in (set(tps), set(tps[1:500]), set(tps[3:]), set()):
        assert split.of(consumer, active) == {
            tp for tp in active if not REQUESTS.match(tp.topic)}


def test_a_new_assignment_is_read_again_and_none_decides_per_partition() -> None:
    split = ControlPartitions(REQUESTS)
    first = _consumer(_tps(10))
    assert split.of(first, set(_tps(10))) == set(_tps(0))
    extra = TP("p.dead-letters", 0)
    second = _consumer([*_tps(10), extra])  # a rebalance: a new Assignment object
    assert split.of(second, {extra, TP("p.requests.t1", 0)}) == {extra}
    none = SimpleNamespace(_subscription=SimpleNamespace(subscription=None))
    assert split.of(none, {extra, TP("p.requests.t1", 0)}) == {extra}


class _Verifying:
    """What verify_all_partitions_active reads of a Faust consumer."""

    def __init__(self, tps: list[TP]) -> None:
        self.tps = tps
        self.should_stop = False
        self.yields = 0
        self.verified: list[TP] = []

    def assignment(self) -> set[TP]:
        return set(self.tps)

    async def sleep(self, _s: float) -> None:
        self.yields += 1

    def verify_event_path(self, _now: float, tp: TP) -> None:
        self.verified.append(tp)


def test_every_partition_is_verified_with_a_yield_per_chunk_not_per_partition() -> None:
    per_partition.install()
    verify = faust_consumer.Consumer.verify_all_partitions_active
    c = _Verifying(_tps(1000))
    asyncio.run(verify(c))  # type: ignore[arg-type]
    assert sorted(c.verified) == sorted(c.tps)
    assert c.yields == -(-len(c.tps) // per_partition.VERIFY_CHUNK)  # 11, not 1,003


def test_the_active_set_is_built_once_and_handed_back_as_is() -> None:
    per_partition.install()
    get = faust_consumer.Consumer._get_active_partitions
    built: list[set[TP]] = []
    tps = set(_tps(5))

    def set_active(tp_set: set[TP]) -> set[TP]:
        built.append(set(tp_set))
        c._active_partitions = set(tp_set)
        return c._active_partitions

    c = SimpleNamespace(_active_partitions=None, assignment=lambda: tps,
                        _set_active_tps=set_active)
    first = get(c)  # type: ignore[arg-type]
    assert first == tps and len(built) == 1
    assert get(c) is first and len(built) == 1  # type: ignore[arg-type]


def test_records_a_control_partition_gets_between_the_two_fetches_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request partitions' fetch names every active partition (no pass to leave the
    control ones out): what it returns for a control partition is added to what the first
    fetch took, never put in its place."""
    cls = faust_aiokafka.AIOKafkaConsumerThread
    control, request = TP("p.completions", 0), TP("p.requests.t1", 0)
    batches = [{control: ["c1", "c2"]}, {control: ["c3"], request: ["r1"]}]
    asked: list[set[TP]] = []

    async def fetch(self: Any, consumer: Any, active: Any, timeout: Any = None,
                    max_records: Any = None) -> Any:
        asked.append(set(active))
        return batches.pop(0)

    monkeypatch.setattr(cls, "_fetch_records", fetch)
    monkeypatch.setattr(cls, "_triage_priority", False, raising=False)  # restored after
    serve_control_partitions_first(REQUESTS.pattern)
    got = asyncio.run(cls._fetch_records(None, _consumer([control, request]),
                                         {control, request}, timeout=1.0, max_records=10))
    assert got == {control: ["c1", "c2", "c3"], request: ["r1"]}
    assert asked == [{control}, {control, request}]
