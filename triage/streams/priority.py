"""Heartbeats, completions and ticks before requests: a request flood must not starve them
(issue 12, item 7; docs/architecture.md, "Priority under a request flood").

One consumer feeds every agent. aiokafka keeps one fetched batch per partition and hands
records out in the order the batches arrived, up to `max_poll_records` per call; a
request partition's batch can hold thousands of records (a producer batch is fetched
whole), and while it lasts, the partitions behind it get nothing: a heartbeat produced
during a flood waited behind ~15,000 requests. So each fetch first takes what the
control partitions (everything that is not a tenant's request topic) have buffered, then
fills the rest of its budget from the request partitions. A control message then waits
only for the bounded batch ahead of it (MAX_POLL_RECORDS in app.py).
"""

from __future__ import annotations

import re
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka


def serve_control_partitions_first(request_pattern: str) -> None:
    """Patch Faust's aiokafka consumer thread (once per process, idempotent)."""
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_triage_priority", False):
        return
    fetch = cls._fetch_records
    requests = re.compile(request_pattern)
    split = ControlPartitions(requests)

    async def _fetch_records(self: Any, consumer: Any, active_partitions: Any,
                             timeout: float | None = None,
                             max_records: int | None = None) -> Any:
        if active_partitions:
            control = split.of(consumer, active_partitions)
            if control and len(control) < len(active_partitions):
                records = await fetch(self, consumer, control, timeout=0,
                                      max_records=max_records)
                if records:
                    taken = sum(len(r) for r in records.values())
                    left = None if max_records is None else max_records - taken
                    if left is None or left > 0:
                        # all of them: the control ones were just drained, and building
                        # the request partitions alone costs a pass over 1,000 tenants.
                        # Appended, not replaced: a control partition that got records
                        # in between keeps the ones taken first.
                        more = await fetch(self, consumer, active_partitions, timeout=0,
                                           max_records=left)
                        for tp, recs in more.items():
                            records.setdefault(tp, []).extend(recs)
                    return records
        return await fetch(self, consumer, active_partitions, timeout=timeout,
                           max_records=max_records)

    cls._fetch_records = _fetch_records
    cls._triage_priority = True


class ControlPartitions:
    """The control partitions among a fetch's active ones, without a pass over them: the
    assigned control partitions are found once per assignment (aiokafka replaces its
    Assignment object on every rebalance), and a fetch takes their intersection with its
    active set, which Python computes over the smaller of the two. A regular-expression
    match per active partition was ~0.3 ms per fetch at 1,000 tenants."""

    def __init__(self, requests: re.Pattern[str]) -> None:
        self._requests = requests
        self._assignment: Any = None
        self._control: frozenset[Any] = frozenset()

    def of(self, consumer: Any, active: Any) -> set[Any]:
        assignment = consumer._subscription.subscription
        assignment = None if assignment is None else assignment.assignment
        if assignment is None:  # between assignments: decide per partition
            return {tp for tp in active if not self._requests.match(tp.topic)}
        if assignment is not self._assignment:
            self._assignment = assignment
            self._control = frozenset(tp for tp in assignment.tps
                                      if not self._requests.match(tp.topic))
        return active & self._control  # type: ignore[no-any-return]
