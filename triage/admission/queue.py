"""The bounded queue of one pool: bounds per tenant and per pool, a max wait, and an
order set by the policy: fair lanes (check 4), one FIFO lane, or one earliest-deadline
lane (the baselines).

Layout: one heap per lane (a tenant, or everyone) ordered by (class, deadline, arrival)
(by arrival alone in FIFO order); a heap of lanes ordered by (class of its head,
rank, head deadline), the rank being the tenant's virtual service with the head's
deadline blended in (`lane_key`); an expiry heap. Entries are invalidated lazily (a
request that left is skipped when met), so push, pop and remove are O(log n).
"""

from __future__ import annotations

from typing import Any, Final, cast

from triage.admission.heaps import heappop, heappush
from triage.admission.pending import Pending
from triage.admission.policy import ORDER_FAIR, ORDER_FIFO

_ALL: Final = ""  # single-lane orders: every tenant shares one lane


def _before(entry: object, last: object) -> bool:
    """Does lane entry `entry` sort before `last` (None: nothing is before it)?"""
    if last is None:
        return False
    a = cast(tuple[int, float, int, Pending], entry)
    b = cast(tuple[int, float, int, Pending], last)
    return (a[0], a[1], a[2]) < (b[0], b[1], b[2])


class PoolQueue:
    """Waiting requests of one pool."""

    __slots__ = (
        "_behind_memo",
        "_expiry",
        "_lane_heap",
        "_lane_ver",
        "_lanes",
        "blend",
        "fifo",
        "in_quota",
        "max_size",
        "members",
        "single",
        "tenant_count",
        "tenant_limits",
        "tenant_work_s",
        "work_s",
    )

    def __init__(
        self, *, max_size: int, tenant_limits: dict[str, int], order: int = ORDER_FAIR,
        deadline_s_per_token: float = 0.0,
    ) -> None:
        self.max_size = max_size
        self.tenant_limits = tenant_limits
        self.fifo = order == ORDER_FIFO  # one lane by arrival
        self.single = order != ORDER_FAIR  # one lane for every tenant
        self.blend = deadline_s_per_token  # fair lanes: deadline + blend x service
        self.members: dict[str, Pending] = {}
        self.in_quota = 0  # members of priority class 0 (within their tenant's quota)
        self.tenant_count: dict[str, int] = {}
        self.work_s = 0.0  # predicted seconds of queued work (for drain estimates)
        self.tenant_work_s: dict[str, float] = {}
        self._lanes: dict[str, list[tuple[int, float, int, Pending]]] = {}
        self._lane_heap: list[tuple[int, float, float, int, int, str]] = []
        self._lane_ver: dict[str, int] = {}
        # what `behind` last found in each lane: (head's seq, n, requests, the last one's
        # entry), dropped when a change in the lane could change it
        self._behind_memo: dict[str, tuple[int, int, list[Pending], object]] = {}
        self._expiry: list[tuple[float, int, Pending]] = []

    def __len__(self) -> int:
        return len(self.members)

    def has_room(self, tenant: str) -> tuple[bool, bool]:
        """(pool has room, tenant has room)."""
        return (
            len(self.members) < self.max_size,
            self.tenant_count.get(tenant, 0) < self.tenant_limits.get(tenant, self.max_size),
        )

    def push(self, p: Pending, service: float, work_s: float) -> None:
        """Add `p` (its seq, expires_at and enqueued_at already set)."""
        self.members[p.request_id] = p
        if p.cls == 0:
            self.in_quota += 1
        t = p.tenant
        self.tenant_count[t] = self.tenant_count.get(t, 0) + 1
        self.work_s += work_s
        self.tenant_work_s[t] = self.tenant_work_s.get(t, 0.0) + work_s
        lane_key = _ALL if self.single else t
        lane = self._lanes.get(lane_key)
        if lane is None:
            lane = self._lanes[lane_key] = []
        entry = (0, float(p.seq), p.seq, p) if self.fifo else (p.cls, p.deadline, p.seq, p)
        heappush(lane, entry)
        memo = self._behind_memo.get(lane_key)
        if memo is not None and (len(memo[2]) < memo[1] or _before(entry, memo[3])):
            del self._behind_memo[lane_key]  # it lands among the requests behind the head
        if lane[0][2] == p.seq:  # it became the lane's head (compare seqs, not identity:
            self._touch_lane(lane_key, service)  # compiled code re-boxes tuples)
        heappush(self._expiry, (p.expires_at, p.seq, p))

    def _valid(self, p: Pending, seq: int) -> bool:
        return p.seq == seq and self.members.get(p.request_id) is p

    def _lane_head(self, lane_key: str) -> Pending | None:
        lane = self._lanes.get(lane_key)
        while lane:
            _, _, seq, p = lane[0]
            if self._valid(p, seq):
                return p
            heappop(lane)
        return None

    def _touch_lane(self, lane_key: str, service: float) -> None:
        head = self._lane_head(lane_key)
        ver = self._lane_ver.get(lane_key, 0) + 1
        self._lane_ver[lane_key] = ver
        if head is not None:
            if self.single:
                heappush(self._lane_heap, (0, 0.0, 0.0, head.seq, ver, lane_key))
            else:
                heappush(self._lane_heap, (
                    head.cls, self.lane_key(head.deadline, service), head.deadline, head.seq,
                    ver, lane_key,
                ))

    def lane_key(self, deadline: float, service: float) -> float:
        """A fair lane's rank: its tenant's weighted service, with the head's deadline
        blended in (`deadline_s_per_token`): among tenants whose service is close, the
        tighter deadline goes first; a tenant far ahead still waits (fairness holds)."""
        blend = self.blend
        return deadline + blend * service if blend > 0.0 else service

    def head_request(self) -> Pending | None:
        """The next request in fairness order; its lane's entry is left on top of the heap
        (set_aside pops it). Returns no key, so a dispatch pass allocates nothing here."""
        heap = self._lane_heap
        while heap:
            _cls, _service, _deadline, seq, ver, lane_key = heap[0]
            if ver == self._lane_ver.get(lane_key, -1):
                p = self._lane_head(lane_key)
                if p is not None and p.seq == seq:
                    return p
            heappop(heap)
        return None

    def head(self) -> tuple[Pending, tuple[int, float, float]] | None:
        """The next request in fairness order, and its lane's key (class, rank, deadline;
        the rank is `lane_key`'s)."""
        p = self.head_request()
        if p is None:
            return None
        cls, service, deadline, _seq, _ver, _lane = self._lane_heap[0]
        return p, (cls, service, deadline)

    def set_aside(self) -> object | None:
        """Pop the top lane entry so a dispatch pass can look at the next lane.

        Call it right after head_request() (or head()) returned a request, with no queue
        change in between: that left the lane's (valid) entry on top, so it is popped
        without a second validation (a pass sets lanes aside several times per completion).
        The entry is opaque to the caller: typed `object`, the compiled build hands the
        tuple back as it is instead of unpacking it into native fields and rebuilding it."""
        heap = cast(list[Any], self._lane_heap)
        return heappop(heap) if heap else None

    def put_back(self, entry: object) -> None:
        """Return an entry set_aside gave out."""
        heappush(cast(list[Any], self._lane_heap), entry)

    def remove(self, p: Pending, service: float, work_s: float, *, rekeyed: bool = False) -> None:
        """Take `p` out (dispatched, expired, cancelled); its heap entries die lazily.

        rekeyed: the caller refreshes the tenant's lane right after (a dispatch charges
        the tenant), so with per-tenant lanes this re-key would be stale at once."""
        if self.members.get(p.request_id) is not p:
            return
        del self.members[p.request_id]
        if p.cls == 0:
            self.in_quota -= 1
        t = p.tenant
        n = self.tenant_count[t] - 1
        if n:
            self.tenant_count[t] = n
        else:
            del self.tenant_count[t]
        self.work_s = max(0.0, self.work_s - work_s)
        self.tenant_work_s[t] = max(0.0, self.tenant_work_s.get(t, 0.0) - work_s)
        lane_key = _ALL if self.single else t
        memo = self._behind_memo.get(lane_key)
        if memo is not None and (memo[0] == p.seq or p in memo[2]):
            del self._behind_memo[lane_key]
        if self.single:
            self._touch_lane(_ALL, service)
        elif not rekeyed:
            self._touch_lane(t, service)

    def refresh(self, tenant: str, service: float) -> None:
        """The tenant's service changed: re-key its lane."""
        if not self.single and tenant in self.tenant_count:
            self._touch_lane(tenant, service)

    def behind(self, head: Pending, n: int) -> list[Pending]:
        """Up to `n` requests that follow `head` in its own lane, in lane order (head is
        the lane's head). A dispatch pass tries them when the head is blocked, so one
        request waiting for room does not block the later ones of its lane that fit.
        O(n log m): the entries are popped and pushed back.

        Remembered until a push or a removal in the lane could change the answer (`push`,
        `remove`): a blocked head is looked behind on every dispatch pass, and finding
        the same requests again cost 21% of a saturated `tenants13@100` run under the
        full policy. The caller only reads the list."""
        lane_key = _ALL if self.single else head.tenant
        memo = self._behind_memo.get(lane_key)
        if memo is not None and memo[0] == head.seq and memo[1] == n:
            return memo[2]
        lane = self._lanes.get(lane_key)
        out: list[Pending] = []
        if not lane:
            return out
        popped: list[tuple[int, float, int, Pending]] = []
        last: object = None
        while lane and len(out) < n:
            entry = heappop(lane)
            _, _, seq, p = entry
            if not self._valid(p, seq):
                continue  # dead entry: leave it out
            popped.append(entry)
            if p is not head:
                out.append(p)
                last = entry
        for entry in popped:
            heappush(lane, entry)
        self._behind_memo[lane_key] = (head.seq, n, out, last)
        return out

    def pop_expired(self, now: float) -> list[Pending]:
        """Requests whose wait ended at or before `now`, soonest first (still members)."""
        out: list[Pending] = []
        heap = self._expiry
        while heap and heap[0][0] <= now:
            _, seq, p = heappop(heap)
            if self._valid(p, seq):
                out.append(p)
        return out

    def next_expiry(self) -> float | None:
        heap = self._expiry
        while heap:
            _, seq, p = heap[0]
            if self._valid(p, seq):
                return heap[0][0]
            heappop(heap)
        return None
