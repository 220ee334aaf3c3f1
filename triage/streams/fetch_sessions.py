"""Incremental fetch sessions (Kafka's KIP-227) for the aiokafka consumer under Faust.

aiokafka 0.14 sends every fetch as a full one: each request names every assigned
partition that has no buffered records, and each response carries a header for every
one of them, most empty. The admission app reads one request topic per tenant, so at
1,000 tenants every fetch encoded and decoded ~1,000 partitions in Python and the CPU
per request was 3.3-3.9x the 10-tenant figure (docs/architecture.md, "CPU per request
as pools and tenants grow"). With a session the broker remembers the partitions and
their fetch offsets: after the first full fetch a request names only the partitions
whose offset changed (those that returned records and were consumed) or that join or
leave the session, and a response carries only the partitions that have something to
say. Both become O(partitions with traffic).

aiokafka leaves a partition out of a fetch while it still holds buffered records from
the last one; in a session a partition left out would still be fetched from its cached
offset (the same records again), so such a partition is *forgotten* for that request
and added back, at its new offset, once consumed. Any error, a failed or cancelled
send, or a session the broker no longer knows (after its restart) starts a new session
with a full fetch: a lost session costs one full fetch, never a record.

Installed on each consumer's fetcher after it starts (engine.py). Nothing here decides
what is fetched: aiokafka still picks the partitions and offsets; this only changes how
the request says it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from aiokafka.protocol.fetch import FetchRequest
from aiokafka.structs import TopicPartition

log = logging.getLogger(__name__)

# After a fetch that brought no records, and with no fetched records still waiting to be
# consumed (their partitions would be left out of the fetch), the next one waits for the
# first byte, up to this long. An idle consumer sent a fetch every 5 ms otherwise
# (engine.FETCH_MAX_WAIT_MS, held for 16 KB): 200 a second, 10-12% of a core with no
# traffic at all. Waiting for the first byte also answers a lone record at once, not
# after the 5 ms hold. Once records flow, fetches are held as configured again, so a
# steady stream is still fetched in batches (docs/architecture.md, "An idle consumer").
IDLE_WAIT_MS: Final = 100
FIRST_SESSION_VERSION: Final = 7  # FetchRequest v7 added session_id and session_epoch
NEW_SESSION: Final = 0  # session_id 0 with epoch 0: "open a session for this full fetch"
MAX_EPOCH: Final = 2**31 - 1

Offsets = dict[TopicPartition, int]  # tp -> fetch offset
Topics = list[tuple[str, list[tuple[int, int, int]]]]  # aiokafka's (topic, [(p, offset, max)])


def _by_topic(parts: Offsets, max_bytes: int) -> Topics:
    topics: dict[str, list[tuple[int, int, int]]] = {}
    for tp, offset in parts.items():
        topics.setdefault(tp.topic, []).append((tp.partition, offset, max_bytes))
    return list(topics.items())


class PlannedFetch(FetchRequest):
    """A full fetch as a map of partition -> offset (fetch_scan.py builds these): the
    session diffs the map against what the broker holds without first flattening it
    into aiokafka's per-topic lists, which cost more than the walk itself."""

    def __init__(self, max_wait_ms: int, min_bytes: int, max_bytes: int, isolation_level: int,
                 wanted: Offsets, partition_max_bytes: int, rack_id: str = "") -> None:
        super().__init__(max_wait_ms, min_bytes, max_bytes, isolation_level, [],
                         rack_id=rack_id)
        self.wanted = wanted
        self.partition_max_bytes = partition_max_bytes
        self._flat: Topics | None = None

    @property
    def topics(self) -> Topics:
        if self._flat is None:
            self._flat = _by_topic(self.wanted, self.partition_max_bytes)
        return self._flat

    def build(self, request_struct_class: Any) -> Any:
        self._topics = self.topics
        return super().build(request_struct_class)


def _planned(base: FetchRequest) -> PlannedFetch:
    if isinstance(base, PlannedFetch):
        return base
    wanted: Offsets = {}
    max_bytes = 0  # one figure for every partition (aiokafka's max_partition_fetch_bytes)
    for topic, partitions in base.topics:
        for partition, offset, limit in partitions:
            wanted[TopicPartition(topic, partition)] = offset
            max_bytes = limit
    return PlannedFetch(base._max_wait_ms, base._min_bytes, base._max_bytes,
                        base._isolation_level, wanted, max_bytes, base._rack_id)


class FetchCounts:
    """Fetch requests sent by every consumer of this process, by kind: each session adds
    to it as it asks (a consumer started again later adds to the same figures, and
    nothing is kept per consumer); the metrics read it at scrape."""

    __slots__ = ("full", "incremental", "long_waits")

    def __init__(self) -> None:
        self.full = 0
        self.incremental = 0
        self.long_waits = 0  # of them, those that waited for the first byte (idle)


SENT = FetchCounts()


class FetchSession:
    """One broker's session, as this consumer last told it (one fetch in flight per
    broker at a time: aiokafka's `_in_flight`)."""

    __slots__ = ("epoch", "full_fetches", "incremental_fetches", "opened", "parts", "session_id")

    def __init__(self) -> None:
        self.session_id = NEW_SESSION
        self.epoch = 0
        self.parts: Offsets = {}  # what the broker holds for this session
        self.full_fetches = 0
        self.incremental_fetches = 0
        self.opened = 0  # sessions the broker granted

    def reset(self) -> None:
        """Forget the session: the next fetch is a full one that opens a new session."""
        self.session_id = NEW_SESSION
        self.epoch = 0
        self.parts = {}

    def request(self, base: FetchRequest) -> SessionFetchRequest:
        """`base` (a full request: aiokafka's, or fetch_scan's map) as this session's next
        request."""
        plan = _planned(base)
        wanted = plan.wanted
        if self.session_id == NEW_SESSION:
            changed = wanted
            forgotten: list[TopicPartition] = []
            self.full_fetches += 1
            SENT.full += 1
        else:
            parts = self.parts
            get = parts.get
            changed = {tp: v for tp, v in wanted.items() if get(tp) != v}
            # what the session holds and the request no longer wants: none when every
            # partition it holds is still wanted (counted, without a second full pass)
            kept = len(wanted) - sum(1 for tp in changed if tp not in parts)
            forgotten = [] if kept == len(parts) else [tp for tp in parts if tp not in wanted]
            self.incremental_fetches += 1
            SENT.incremental += 1
        return SessionFetchRequest(base, plan, self, changed, forgotten)

    def answered(self, req: SessionFetchRequest, error_code: int, session_id: int) -> None:
        """The broker answered `req`: move to the next epoch, or start over."""
        if not req.in_session:
            return  # sent as a sessionless full fetch (a broker older than v7)
        if error_code:
            log.info("fetch session %d ended by the broker (error %d): a full fetch next",
                     self.session_id, error_code)
            self.reset()
            return
        if self.session_id == NEW_SESSION:
            self.session_id = session_id  # 0: the broker declined; the next is full again
            self.epoch = 1 if session_id != NEW_SESSION else 0
            self.opened += session_id != NEW_SESSION
        else:
            self.epoch = self.epoch + 1 if self.epoch < MAX_EPOCH else 1
        self.parts = req.wanted if self.session_id != NEW_SESSION else {}


class SessionFetchRequest(FetchRequest):
    """A fetch that names only what changed since the session's last request.

    aiokafka's response handler reads `topics` of the request it made (`origin`) to match
    each partition of the response with the offset it was fetched at. Once the response
    is in, `origin` is narrowed to the partitions the response names: a response of 3
    partitions out of 1,000 then costs 3 lookups, not a 1,000-entry map."""

    def __init__(self, origin: FetchRequest, plan: PlannedFetch, session: FetchSession,
                 changed: Offsets, forgotten: list[TopicPartition]) -> None:
        super().__init__(plan._max_wait_ms, plan._min_bytes, plan._max_bytes,
                         plan._isolation_level, _by_topic(changed, plan.partition_max_bytes),
                         rack_id=plan._rack_id)
        self.origin = origin  # the request aiokafka holds and reads the response against
        self.plan = plan
        self.wanted = plan.wanted
        self.forgotten = forgotten
        self.session_id = session.session_id
        self.epoch = session.epoch
        self.in_session = False
        self._view: Topics | None = None

    @property
    def topics(self) -> Topics:
        if self._view is None:
            self._view = self.plan.topics
        return self._view

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION < FIRST_SESSION_VERSION:
            self._topics = self.plan.topics  # no sessions: a plain full fetch
            return super().build(request_struct_class)
        struct = super().build(request_struct_class)
        struct.session_id = self.session_id
        struct.session_epoch = self.epoch
        forgotten: dict[str, list[int]] = {}
        for tp in self.forgotten:
            forgotten.setdefault(tp.topic, []).append(tp.partition)
        struct.forgotten_topics_data = list(forgotten.items())
        self.in_session = True
        return struct

    def matched(self, response: Any) -> None:
        """Narrow `topics` to the partitions `response` names (those it knows)."""
        wanted = self.wanted
        max_bytes = self.plan.partition_max_bytes
        view: Topics = []
        kept: list[tuple[str, list[Any]]] = []
        for topic, partitions in response.topics:
            mine: list[tuple[int, int, int]] = []
            known: list[Any] = []
            for part in partitions:
                offset = wanted.get(TopicPartition(topic, part[0]))
                if offset is not None:  # never a partition this consumer did not ask for
                    mine.append((part[0], offset, max_bytes))
                    known.append(part)
            if mine:
                view.append((topic, mine))
                kept.append((topic, known))
        self._view = view
        response.topics = kept
        origin = self.origin
        if isinstance(origin, PlannedFetch):
            origin._flat = view
        else:
            origin._topics = view


class SessionClient:
    """The fetcher's view of the client: fetches go through their broker's session,
    everything else straight to aiokafka's client."""

    def __init__(self, client: Any, buffered: Callable[[], bool]) -> None:
        self._client = client
        self.sessions: dict[int, FetchSession] = {}
        self.idle: set[int] = set()  # brokers whose last fetch brought no records
        # Does the consumer still hold fetched records? Their partitions are left out of
        # the next fetch, and records arriving there would not end a long wait.
        self._buffered = buffered

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def send(self, node_id: int, request: Any, **kwargs: Any) -> Any:
        if not isinstance(request, FetchRequest) or isinstance(request, SessionFetchRequest):
            return await self._client.send(node_id, request, **kwargs)
        session = self.sessions.get(node_id)
        if session is None:
            session = self.sessions[node_id] = FetchSession()
        req = session.request(request)
        if node_id in self.idle and not self._buffered():
            req._max_wait_ms, req._min_bytes = IDLE_WAIT_MS, 1
            SENT.long_waits += 1
        try:
            response = await self._client.send(node_id, req, **kwargs)
        except BaseException:  # failed or cancelled: the broker's view is unknown now
            session.reset()
            self.idle.discard(node_id)
            raise
        if carries_records(response):
            self.idle.discard(node_id)
        else:
            self.idle.add(node_id)
        if response.API_VERSION >= FIRST_SESSION_VERSION:
            session.answered(req, response.error_code, response.session_id)
            if response.error_code:
                response.topics = []
        req.matched(response)
        return response


def holds_unconsumed(fetcher: Any, wanted: set[Any] | None) -> bool:
    """Does aiokafka's fetcher hold fetched records of a partition its reader still takes
    from (`wanted`: the partitions the last read asked for; None, not known yet)? Records
    of a partition the reader no longer asks for stay buffered for good: Faust stops
    reading an active table's changelog after recovery, and one such result sat there."""
    records = fetcher._records
    if not records:
        return False
    return wanted is None or any(tp in wanted for tp in records)


def carries_records(response: Any) -> bool:
    """Does this fetch response hold any record bytes? (Each partition's last field is
    its record set, in every FetchResponse version aiokafka reads.)"""
    return any(part[-1] for _topic, partitions in response.topics for part in partitions)


def _speaks_this_aiokafka() -> bool:
    """The private fields of aiokafka 0.14's FetchRequest that SessionFetchRequest reads."""
    probe = FetchRequest(1, 1, 1, 0, [])
    return all(hasattr(probe, a) for a in
               ("_max_wait_ms", "_min_bytes", "_max_bytes", "_isolation_level", "_rack_id",
                "_topics"))


def install(consumer: Any) -> SessionClient | None:
    """Route a started aiokafka consumer's fetches through fetch sessions."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or isinstance(getattr(fetcher, "_client", None), SessionClient):
        return None
    if not _speaks_this_aiokafka():
        log.warning("aiokafka's FetchRequest is not the one fetch_sessions.py was written "
                    "for (0.14): fetching without sessions")
        return None
    reading: list[set[Any] | None] = [None]  # what the last read asked for
    fetched_records = fetcher.fetched_records

    async def read(partitions: Any, timeout: float = 0, max_records: int | None = None) -> Any:
        reading[0] = partitions
        return await fetched_records(partitions, timeout=timeout, max_records=max_records)

    fetcher.fetched_records = read
    client = SessionClient(fetcher._client,
                           buffered=lambda: holds_unconsumed(fetcher, reading[0]))
    fetcher._client = client
    return client

