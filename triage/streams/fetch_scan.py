"""A faster walk of the assignment for aiokafka's fetcher loop.

aiokafka's `Fetcher._get_actions_per_node` runs each time its fetch loop wakes (a fetch
answered, a partition's buffer consumed, a prefetch backoff ended) and walks every
assigned partition through properties and method calls: ~3 ms for the admission app's
~1,000 partitions at 1,000 tenants, 50-120 times a second, a fifth of the process's
time (counted with a temporary wrapper in a 1,000-tenant bench run; docs/architecture.md,
"Incremental fetch sessions"). This is the same decision, partition for partition, with
the per-partition work cut to dictionary reads of the state aiokafka 0.14 keeps: still
O(partitions) per wake, at a smaller constant, and each broker's fetch comes out as a map
of partition -> offset (`PlannedFetch`) that the fetch session diffs directly. aiokafka
shuffles each request's partitions so that a response's byte limit falls on different
ones each time; a session's request names a few partitions, and a full one is far under
the 50 MB limit here, so the order is left as the walk found it. Where aiokafka reads a
follower for a partition (KIP-392 rack-aware fetching), aiokafka's own walk runs instead.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Final

from triage.streams.fetch_sessions import PlannedFetch

# A walk waits this many times the last walk's CPU time after it (a walk of 1,000
# partitions: ~0.2 ms, so the next may start ~2 ms later; of 20: ~10 µs, 0.1 ms later),
# and never more than MAX_WALK_SPACING_S. CPU time, not wall time: a walk preempted for
# the GIL's 5 ms switch interval would otherwise hold the next one back 50 ms.
WALK_SPACING: Final = 10.0
MAX_WALK_SPACING_S: Final = 0.005


def actions_per_node(self: Any, assignment: Any) -> tuple[Any, ...]:
    """What `Fetcher._get_actions_per_node` returns: (fetch requests per node, partitions
    awaiting an offset reset per node, how long to wait, whether metadata is stale, the
    resume futures of paused partitions). The fetch loop wakes for every partition whose
    buffer a consumer drains; walks come at most one per WALK_SPACING x the last one's
    duration (sooner, the loop is told to wait the rest), so that walking ~1,000
    partitions stays under a tenth of the loop's time however often it wakes."""
    now = time.perf_counter()
    rest = getattr(self, "_triage_next_walk", 0.0) - now
    if rest > 0.0:
        return [], {}, rest, False, []
    cpu = time.thread_time()
    fetchable: dict[int, dict[Any, int]] = defaultdict(dict)
    awaiting_reset: dict[int, list[Any]] = defaultdict(list)
    backoff_by_nodes: dict[int, list[float]] = defaultdict(list)
    resume_futures: list[Any] = []
    invalid_metadata = False
    records = self._records
    in_flight = self._in_flight
    by_topic = self._client.cluster._partitions  # topic -> partition -> metadata
    for tp, state in assignment._tp_state.items():
        parts = by_topic.get(tp.topic)
        meta = None if parts is None else parts.get(tp.partition)
        node_id = None if meta is None else meta.leader
        if tp in records:  # buffered records not consumed yet
            backoff = records[tp].calculate_backoff()
            if backoff:
                backoff_by_nodes[node_id].append(backoff)  # type: ignore[index]
        elif node_id in in_flight:
            continue
        elif node_id is None or node_id == -1:
            invalid_metadata = True
        elif state._position is None:
            awaiting_reset[node_id].append(tp)  # the leader: no follower is read here
        elif state._paused:
            resume_futures.append(state._resume_fut)
        else:
            fetchable[node_id][tp] = state._position

    fetch_requests = []
    max_bytes = self._max_partition_fetch_bytes
    for node_id, wanted in fetchable.items():
        if node_id in backoff_by_nodes or node_id in awaiting_reset:
            continue
        fetch_requests.append((node_id, PlannedFetch(
            self._fetch_max_wait_ms, self._fetch_min_bytes, self._fetch_max_bytes,
            self._isolation_level, wanted, max_bytes, rack_id=self._client_rack or "",
        )))
    if backoff_by_nodes:
        timeout = min(map(max, backoff_by_nodes.values()))
    else:
        timeout = self._fetcher_timeout
    spacing = WALK_SPACING * (time.thread_time() - cpu)
    self._triage_next_walk = time.perf_counter() + min(spacing, MAX_WALK_SPACING_S)
    return fetch_requests, awaiting_reset, timeout, invalid_metadata, resume_futures


def _speaks_this_aiokafka(fetcher: Any) -> bool:
    """The private state of aiokafka 0.14's fetcher that `actions_per_node` reads."""
    return all(hasattr(fetcher, a) for a in (
        "_records", "_in_flight", "_client", "_max_partition_fetch_bytes",
        "_fetch_max_wait_ms", "_fetch_min_bytes", "_fetch_max_bytes", "_isolation_level",
        "_client_rack", "_fetcher_timeout", "_preferred_read_replica",
    )) and hasattr(fetcher._client.cluster, "_partitions")


def install(fetcher: Any) -> bool:
    """Use the faster walk on `fetcher` unless it reads followers (a client rack is set)
    or is not the aiokafka this was written for."""
    if getattr(fetcher, "_client_rack", None) or not _speaks_this_aiokafka(fetcher):
        return False
    fetcher._get_actions_per_node = actions_per_node.__get__(fetcher)
    return True
