"""An incremental walk of the assignment for aiokafka's fetcher loop.

aiokafka's `Fetcher._get_actions_per_node` runs each time its fetch loop wakes (a fetch
answered, a partition's buffer consumed, a prefetch backoff ended) and walks every
assigned partition: ~3 ms for the admission app's ~1,000 partitions at 1,000 tenants,
50-120 times a second (docs/architecture.md, "Incremental fetch sessions"). A first
rewrite walked the same partitions at a smaller constant (dictionary reads of aiokafka
0.14's state); at 1,000 tenants it still took 43% of the consumer thread's CPU, about
16% of the process's (docs/architecture.md, "An incremental walk").

This one keeps each partition's place (fetchable at an offset, awaiting a reset, paused,
buffered, or without a leader) between walks and re-places only the partitions whose
state changed since the last one. Every change aiokafka makes goes through a few methods
of `TopicPartitionState` (seek, consumed_to, reset_to, await_reset, pause, resume) and
through the fetcher's `_records` dict (records buffered, drained, dropped): both are
wrapped to mark the partition. A new assignment or a metadata refresh (aiokafka replaces
the cluster's partition map) starts a full walk. Marks may come from Faust's event-loop
thread (it seeks there) while the walk runs in the consumer thread. Each broker's fetch
comes out as a map of partition -> offset (`PlannedFetch`) that the fetch session diffs
directly.
Where aiokafka reads a follower for a partition (KIP-392 rack-aware fetching),
aiokafka's own walk runs instead.
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict
from typing import Any, Final

from aiokafka.consumer.subscription_state import TopicPartitionState

from triage.streams.fetch_sessions import PlannedFetch

# A walk waits this many times the last walk's CPU time after it, and never more than
# MAX_WALK_SPACING_S. CPU time, not wall time: a walk preempted for the GIL's 5 ms switch
# interval would otherwise hold the next one back 50 ms. (A full walk of 1,000
# partitions takes ~0.2 ms; an incremental one a few µs.)
WALK_SPACING: Final = 10.0
MAX_WALK_SPACING_S: Final = 0.005

_STATE_CHANGES: Final = ("seek", "consumed_to", "reset_to", "await_reset", "pause", "resume")


def _mark_state_changes() -> None:
    """Once per process: a partition state whose walk mark is set (`_triage_mark`: the
    walk's set of changed partitions, and its partition) adds itself to that set on every
    change of position, reset or pause."""
    cls: Any = TopicPartitionState
    if getattr(cls, "_triage_marks", False):
        return
    for name in _STATE_CHANGES:
        def marked(self: Any, *args: Any, _change: Any = getattr(cls, name)) -> Any:
            try:
                return _change(self, *args)
            finally:
                mark = self.__dict__.get("_triage_mark")
                if mark is not None:
                    mark[0].add(mark[1])
        setattr(cls, name, marked)
    cls._triage_marks = True


class TrackedRecords(OrderedDict):  # type: ignore[type-arg]
    """The fetcher's buffered records (`Fetcher._records`), marking each partition whose
    entry is added or removed."""

    def __init__(self, records: Any, changed: set[Any]) -> None:
        self.changed = changed  # before the entries: adding them marks them
        super().__init__(records)

    def __setitem__(self, tp: Any, value: Any) -> None:
        super().__setitem__(tp, value)
        self.changed.add(tp)

    def __delitem__(self, tp: Any) -> None:
        super().__delitem__(tp)
        self.changed.add(tp)

    def pop(self, tp: Any, *default: Any) -> Any:
        try:
            return super().pop(tp, *default)
        finally:  # marked after the change, as every method here: marked first, a walk
            # in the other thread could place `tp` as still buffered and take the mark,
            # and the partition would not be fetched again until a full walk
            self.changed.add(tp)

    def popitem(self, last: bool = True) -> Any:
        item = super().popitem(last)
        self.changed.add(item[0])
        return item

    def clear(self) -> None:
        cleared = list(self.keys())
        super().clear()
        self.changed.update(cleared)


class Walk:
    """Where each assigned partition stood at the last walk, grouped for the next one:
    fetchable (partition -> offset), awaiting a reset, paused (partition -> its state),
    each by leader; without a leader; or buffered (in no group: its backoff is read on
    every walk)."""

    __slots__ = ("assignment", "by_topic", "changed", "fetchable", "no_leader", "paused",
                 "resets", "where")

    def __init__(self, assignment: Any, by_topic: Any) -> None:
        self.assignment = assignment
        self.by_topic = by_topic
        self.changed: set[Any] = set()
        # partition -> (the group holding it, or None when buffered; its leader)
        self.where: dict[Any, tuple[dict[Any, Any] | None, Any]] = {}
        self.fetchable: dict[Any, dict[Any, int]] = defaultdict(dict)
        self.resets: dict[Any, dict[Any, None]] = defaultdict(dict)
        self.paused: dict[Any, dict[Any, Any]] = defaultdict(dict)
        self.no_leader: dict[Any, None] = {}

    def place(self, tp: Any, state: Any, records: Any) -> None:
        """Put `tp` where its state says (or nowhere: no longer assigned)."""
        old = self.where.pop(tp, None)
        if old is not None and old[0] is not None:
            del old[0][tp]
        if state is None:
            return
        parts = self.by_topic.get(tp.topic)
        meta = None if parts is None else parts.get(tp.partition)
        node = None if meta is None else meta.leader
        group: dict[Any, Any] | None = None
        value: Any = None
        if tp in records:  # buffered records not consumed yet
            pass
        elif node is None or node == -1:
            group = self.no_leader
        elif state._position is None:
            group = self.resets[node]
        elif state._paused:
            group, value = self.paused[node], state
        else:
            group, value = self.fetchable[node], state._position
        if group is not None:
            group[tp] = value
        self.where[tp] = (group, node)


def _walk_for(self: Any, assignment: Any) -> Walk:
    """The fetcher's walk, brought up to date: re-placed where partitions changed, or
    built again from every partition (a new assignment, a metadata refresh, first use)."""
    by_topic = self._client.cluster._partitions  # replaced, not changed, by a refresh
    walk: Walk | None = getattr(self, "_triage_walk", None)
    records = self._records
    if (walk is None or walk.assignment is not assignment or walk.by_topic is not by_topic
            or not isinstance(records, TrackedRecords)):
        walk = self._triage_walk = Walk(assignment, by_topic)
        if isinstance(records, TrackedRecords):
            records.changed = walk.changed
        else:
            records = self._records = TrackedRecords(records, walk.changed)
        for tp, state in assignment._tp_state.items():
            state._triage_mark = (walk.changed, tp)  # marked first, then read: a change
            walk.place(tp, state, records)  # from the other thread is placed next walk
        return walk
    changed = walk.changed
    if changed:
        states = assignment._tp_state
        # popped one at a time, not iterated: Faust seeks from its event loop's thread
        # (`ThreadDelegateConsumer._seek`), so a mark may arrive while this runs
        while changed:
            tp = changed.pop()
            walk.place(tp, states.get(tp), records)
    return walk


def actions_per_node(self: Any, assignment: Any) -> tuple[Any, ...]:
    """What `Fetcher._get_actions_per_node` returns: (fetch requests per node, partitions
    awaiting an offset reset per node, how long to wait, whether metadata is stale, the
    resume futures of paused partitions). Walks come at most one per WALK_SPACING x the
    last one's CPU time (sooner, the loop is told to wait the rest)."""
    now = time.perf_counter()
    rest = getattr(self, "_triage_next_walk", 0.0) - now
    if rest > 0.0:
        return [], {}, rest, False, []
    cpu = time.thread_time()
    walk = _walk_for(self, assignment)
    in_flight = self._in_flight
    where = walk.where
    backoff_by_nodes: dict[Any, list[float]] = defaultdict(list)
    for tp, record in list(self._records.items()):  # a seek from the other thread drops one
        at = where.get(tp)
        if at is not None:  # assigned: buffered records not consumed yet
            backoff = record.calculate_backoff()
            if backoff:
                backoff_by_nodes[at[1]].append(backoff)
    awaiting_reset = {node: list(tps) for node, tps in walk.resets.items()
                      if tps and node not in in_flight}
    resume_futures = [state._resume_fut for node, states in walk.paused.items()
                      if node not in in_flight for state in states.values()]
    fetch_requests = []
    max_bytes = self._max_partition_fetch_bytes
    for node_id, wanted in walk.fetchable.items():
        if (not wanted or node_id in in_flight or node_id in backoff_by_nodes
                or node_id in awaiting_reset):
            continue
        fetch_requests.append((node_id, PlannedFetch(
            self._fetch_max_wait_ms, self._fetch_min_bytes, self._fetch_max_bytes,
            self._isolation_level, dict(wanted), max_bytes, rack_id=self._client_rack or "",
        )))
    if backoff_by_nodes:
        timeout = min(map(max, backoff_by_nodes.values()))
    else:
        timeout = self._fetcher_timeout
    spacing = WALK_SPACING * (time.thread_time() - cpu)
    self._triage_next_walk = time.perf_counter() + min(spacing, MAX_WALK_SPACING_S)
    return fetch_requests, awaiting_reset, timeout, bool(walk.no_leader), resume_futures


def _speaks_this_aiokafka(fetcher: Any) -> bool:
    """The private state of aiokafka 0.14's fetcher that `actions_per_node` reads."""
    return all(hasattr(fetcher, a) for a in (
        "_records", "_in_flight", "_client", "_max_partition_fetch_bytes",
        "_fetch_max_wait_ms", "_fetch_min_bytes", "_fetch_max_bytes", "_isolation_level",
        "_client_rack", "_fetcher_timeout", "_preferred_read_replica",
    )) and hasattr(fetcher._client.cluster, "_partitions") and all(
        hasattr(TopicPartitionState, name) for name in _STATE_CHANGES)


def install(fetcher: Any) -> bool:
    """Use the incremental walk on `fetcher` unless it reads followers (a client rack is
    set) or is not the aiokafka this was written for."""
    if getattr(fetcher, "_client_rack", None) or not _speaks_this_aiokafka(fetcher):
        return False
    _mark_state_changes()
    fetcher._get_actions_per_node = actions_per_node.__get__(fetcher)
    return True
