"""The dispatcher of one pool: single owner of the pool's ledger and queue.

It composes checks 2-5 (KV fit, SLA fit, fairness, prediction), the bounded
queue, preemption and hysteresis. Handlers take `now` and return decisions;
nothing here reads a clock or does I/O.

Dispatch order: an arrival may start at once only if the queue is empty or it
outranks the queue's head; otherwise it waits its turn. A dispatch pass (after
a completion, a heartbeat or on a tick) serves the queue in fairness order,
looking past at most `lookahead` blocked tenants, and never past a head that
has waited more than `backfill_s` (so big requests are not starved by small
ones slipping by; a tightened head is the exception: it waits by design).
"""

from __future__ import annotations

import math
from typing import Final

from triage.admission.decision import (
    ACCEPT,
    COMPLETE,
    PREEMPT,
    QUEUE,
    REJECT,
    TIMEOUT,
    Decision,
    ScaleEvent,
)
from triage.admission.fairness import FairShare
from triage.admission.heaps import heapify, heappop, heappush
from triage.admission.holding import soonest_fit
from triage.admission.hysteresis import HysteresisMonitor, HysteresisSettings
from triage.admission.kvcache import GpuSlot, PoolLedger
from triage.admission.pending import CLASS_IDLE, Pending
from triage.admission.policy import ORDER_FIFO, PolicyFlags
from triage.admission.predictor import CostModel, WorkloadPredictor
from triage.admission.preemption import RunnerHeap, outranks, should_preempt
from triage.admission.queue import PoolQueue
from triage.topics.reasons import Outcome, ReasonCode
from triage.topics.reasons import ReasonCode as R

# Module names are Final so the compiled build reads them from C statics (any other
# global costs a dict lookup on every use); R is an import alias for the same reason.
PREEMPT_CANDIDATES: Final = 4
# time constant of a GPU's recent prefill work (its prefills stall every decode there)
PREFILL_WINDOW_S: Final = 5.0
# Idle capacity for over-quota work: the GPU spends under this share of its time in
# prefills (each stalls every decode there); the in-quota runners must also keep their
# SLA slack (_idle_capacity).
IDLE_MAX_STALL: Final = 0.15
# queued work that takes this long to drain reads as a saturated pool (hysteresis)
DRAIN_HORIZON_S: Final = 10.0


def _preempts_for(reason: ReasonCode) -> bool:
    """May a head blocked for `reason` preempt? Preemption frees KV memory; a head short
    of time gains little from one fewer neighbour and the victim pays its prefill again,
    so only memory shortage preempts. (Identity tests, not `in` a tuple: that compares
    strings on every blocked head.)"""
    return reason is R.GPU_MEMORY_INSUFFICIENT or reason is R.RESERVATION_FLOOR


_MEMORY_REASONS: Final = frozenset(
    {R.GPU_MEMORY_INSUFFICIENT, R.RESERVATION_FLOOR, R.NO_CAPACITY, R.TIGHTENED}
)


class PoolSettings:
    """What a dispatcher needs to know about its pool, resolved from configuration."""

    __slots__ = (
        "gpu_timeout_s",
        "hysteresis",
        "kv_bytes_per_token",
        "max_concurrency",
        "max_queue_wait_s",
        "max_seqs",
        "model_floors",
        "name",
        "queue_max",
        "tenant_queue_max",
        "tenant_shares",
        "weights",
    )

    def __init__(
        self, *, name: str, kv_bytes_per_token: dict[str, int], model_floors: dict[str, int],
        tenant_shares: dict[str, float], weights: dict[str, float], queue_max: int,
        tenant_queue_max: dict[str, int], max_queue_wait_s: dict[str, float],
        max_concurrency: dict[str, int], hysteresis: HysteresisSettings, gpu_timeout_s: float,
        max_seqs: int = 256,
    ) -> None:
        self.name = name
        self.kv_bytes_per_token = kv_bytes_per_token
        self.model_floors = model_floors
        self.tenant_shares = tenant_shares
        self.weights = weights
        self.queue_max = queue_max
        self.tenant_queue_max = tenant_queue_max
        self.max_queue_wait_s = max_queue_wait_s
        self.max_concurrency = max_concurrency
        self.hysteresis = hysteresis
        self.gpu_timeout_s = gpu_timeout_s
        self.max_seqs = max_seqs  # sequences one GPU's engine runs at once


class DispatcherStats:
    """Counters a dispatcher keeps for metrics and the simulator's report."""

    __slots__ = (
        "completed",
        "dispatched",
        "failed",
        "preemptions",
        "queued",
        "recompute_tokens",
        "rejected",
        "timed_out",
    )

    def __init__(self) -> None:
        self.dispatched = 0
        self.queued = 0
        self.rejected = 0
        self.timed_out = 0
        self.completed = 0
        self.failed = 0
        self.preemptions = 0
        self.recompute_tokens = 0

    @property
    def preemption_rate(self) -> float:
        """Preemptions per dispatch (the seed's canary: worry above 2%)."""
        return self.preemptions / self.dispatched if self.dispatched else 0.0


class Dispatcher:
    """Owns one pool: ledger, queue, fairness, runners, hysteresis."""

    def __init__(
        self, *, settings: PoolSettings, flags: PolicyFlags, predictor: WorkloadPredictor,
        expect_heartbeats: bool = False,
    ) -> None:
        self.settings = settings
        self.flags = flags
        self.predictor = predictor
        self.expect_heartbeats = expect_heartbeats
        self.pool = settings.name
        models = list(settings.kv_bytes_per_token)
        self.ledger = PoolLedger(
            pool=settings.name, models=models, model_floors=settings.model_floors,
            tenant_shares=settings.tenant_shares,
        )
        self.queue = PoolQueue(
            max_size=settings.queue_max, tenant_limits=settings.tenant_queue_max,
            order=flags.order, deadline_s_per_token=flags.deadline_s_per_token,
        )
        # strict FIFO (the bounded-queue baseline): nothing passes a blocked head
        self.strict = flags.order == ORDER_FIFO
        self.fair = FairShare(weights=settings.weights)
        self.monitor = HysteresisMonitor(settings.hysteresis, enabled=flags.hysteresis)
        self.inflight: dict[str, Pending] = {}
        self.runners = RunnerHeap()
        self.tenant_running: dict[str, int] = {}
        self.stats = DispatcherStats()
        self.scale_events: list[ScaleEvent] = []
        self._seq = 0
        self._rr = 0
        self._largest_fits: dict[tuple[str, str], int] = {}  # (model, tenant) -> largest fit
        # (tenant, tokens) to give back to the gate's buckets: what requests that left were
        # charged beyond what they used (negative: used more). The core drains it.
        self.settlements: list[tuple[str, float]] = []
        self.held = ""  # model whose memory an aged, KV-blocked queue head holds
        # hold_one_gpu: GPU index -> (the aged head holding it, when it is due to fit);
        # rebuilt by each dispatch pass, the last pass's kept to keep a head's GPU stable
        self.holds: dict[int, tuple[str, float]] = {}
        self._last_holds: dict[str, tuple[int, float]] = {}

    # --- membership of GPUs ---------------------------------------------------------
    def add_gpu(self, *, gpu_id: str, gpu_type: str, speed: float, budget: int) -> GpuSlot:
        slot = self.ledger.add_gpu(gpu_id=gpu_id, gpu_type=gpu_type, speed=speed, budget=budget)
        for m in self.settings.kv_bytes_per_token:
            slot.costs[m] = self.predictor.cost_model(m, gpu_type)
        self._largest_fits.clear()
        return slot

    # --- recovery -------------------------------------------------------------------
    def restore_running(self, p: Pending, gpu_id: str) -> bool:
        """Re-enter a request that was running on `gpu_id` before a restart (its
        reservation, fairness and runner entries are rebuilt). False if that GPU is gone."""
        slot = self.ledger.by_id.get(gpu_id)
        if slot is None:
            return False
        p.kv_bytes = (p.prompt_tokens + p.max_tokens) * self.settings.kv_bytes_per_token[p.model]
        self._seq += 1
        p.seq = self._seq
        p.gpu = slot
        self.ledger.reserve(slot, p.model, p.tenant, p.kv_bytes)
        self.inflight[p.request_id] = p
        self.tenant_running[p.tenant] = self.tenant_running.get(p.tenant, 0) + 1
        self.fair.join(p.tenant)
        if self.flags.preemption:
            self.runners.push(p)
        return True

    def restore_queued(self, p: Pending) -> None:
        """Re-enter a request that was waiting before a restart, keeping its expiry."""
        p.kv_bytes = (p.prompt_tokens + p.max_tokens) * self.settings.kv_bytes_per_token[p.model]
        self._seq += 1
        p.seq = self._seq
        self.fair.join(p.tenant)
        self.queue.push(p, self.fair.service.get(p.tenant, 0.0), p.idle_s)

    def knows(self, request_id: str) -> bool:
        """Is the request live here (queued or running)?"""
        return request_id in self.inflight or request_id in self.queue.members

    # --- arrivals -------------------------------------------------------------------
    def admit(self, p: Pending, now: float) -> list[Decision]:
        """A request that passed the gate. The first decision returned is about it."""
        out: list[Decision] = []
        flags = self.flags
        p.kv_bytes = (p.prompt_tokens + p.max_tokens) * self.settings.kv_bytes_per_token[p.model]
        self._seq += 1
        p.seq = self._seq
        self.fair.join(p.tenant)
        if flags.memory_fit and p.kv_bytes > self._largest_fit(p.model, p.tenant):
            return self._refuse(p, R.NO_CAPACITY, now, None, out)
        p.idle_s = idle = self._idle_prediction(p)
        if flags.sla_fit and idle > p.sla_s:
            return self._refuse(
                p, R.SLA_INFEASIBLE, now, None, out,
                predicted_s=idle, detail="even an idle GPU would miss the SLA",
            )
        if flags.sla_fit and now + idle > p.deadline:  # created long before it reached us
            self.fair.leave(p.tenant)
            self._settle(p, 0.0)
            self.stats.timed_out += 1
            out.append(self._about(
                p, TIMEOUT, R.DEADLINE_UNREACHABLE, now, predicted_s=idle,
                detail=f"created {now - p.arrived:.3f}s before it arrived; its SLA cannot "
                "be met any more",
            ))
            return out
        limit = self.settings.max_concurrency.get(p.tenant) if flags.quota else None
        if limit is not None and self.tenant_running.get(p.tenant, 0) >= limit:
            reason = R.TENANT_CONCURRENCY
        elif self._may_jump(p):
            slot, reason, raw, pred = self._fit(p, now)
            if slot is not None and self._held_off(p, slot, now + pred):
                slot, reason, raw, pred = self._fit_elsewhere(p, now)
                if slot is None:
                    reason = R.QUEUED_BEHIND  # memory the held head may need
            if slot is not None:
                self._dispatch(p, slot, raw, pred, now, R.ADMITTED, out)
                return out
        else:
            reason = R.QUEUED_BEHIND
        self._queue_or_refuse(p, reason, now, out)
        return out

    def _may_jump(self, p: Pending) -> bool:
        """May an arrival start before the queue? Below saturation, yes when it fits:
        what waits did not fit at the last dispatch pass and nothing was freed since (a
        freeing event runs a pass at once), so it takes room nobody ahead could use
        (work conservation). Saturated, only if it outranks the queue's head: there the
        room it takes is room the queue needs next, and the fairness order decides who
        gets it. Never past an aged head holding the line for its memory (no starvation
        of large requests), nor in strict FIFO (the baseline)."""
        if not self.queue.members:
            return True
        if self.strict:
            return False
        if self.held and p.model == self.held:  # (only set when the whole pool is held)
            return False
        if not self.monitor.saturated:
            return True
        head = self.queue.head()
        if head is None:
            return True
        _, (cls, rank, deadline) = head
        if p.cls != cls:
            return p.cls < cls
        mine = self.queue.lane_key(p.deadline, self.fair.service.get(p.tenant, 0.0))
        return mine < rank or (mine == rank and p.deadline < deadline)

    def _largest_fit(self, model: str, tenant: str) -> int:
        """Largest reservation an empty GPU of the pool could ever give (cached)."""
        key = (model, tenant)
        largest = self._largest_fits.get(key)
        if largest is None:
            largest = self.ledger.largest_fit(model, tenant)
            self._largest_fits[key] = largest
        return largest

    def _idle_prediction(self, p: Pending) -> float:
        """Predicted time on an idle GPU (a pool holds one GPU type), with at most the
        initial buffer: the learned buffer prices the spread of loaded GPUs, and applying
        it here would refuse as infeasible requests an idle GPU serves in time."""
        slots = self.ledger.slots
        if not slots:
            return 0.0
        t = slots[0].costs[p.model].predict_idle(p.prompt_tokens, p.expected_out)
        b = self._buffer(p.model)
        initial = self.predictor.initial_buffer
        return t * (b if b < initial else initial)

    def _buffer(self, model: str) -> float:
        fixed = self.flags.variance_buffer
        return fixed if fixed is not None else self.predictor.buffer_value(model)

    # --- the checks -----------------------------------------------------------------
    def _fit(
        self, p: Pending, now: float, sla: bool = True, unheld: bool = False
    ) -> tuple[GpuSlot | None, ReasonCode, float, float]:
        """Checks 2 and 3 for `p` on the best GPU: (GPU or None, reason, raw, buffered).
        `sla=False` skips check 3 (a last chance before a certain timeout); `unheld`
        leaves out the GPUs that aged heads hold."""
        flags = self.flags
        if not flags.memory_fit:
            slot = self._round_robin()
            if slot is None:
                return None, R.NO_CAPACITY, 0.0, 0.0
        else:
            ledger = self.ledger
            if unheld:
                slot = ledger.scan(p.model, p.tenant, p.kv_bytes, self.holds)
                if slot is None:
                    return None, R.GPU_MEMORY_INSUFFICIENT, 0.0, 0.0
            else:
                slot = ledger.best(p.model, p.tenant, p.kv_bytes)
            if slot is None:
                top, _room = self.ledger.peek(p.model)
                if top is None:
                    return None, R.NO_CAPACITY, 0.0, 0.0
                floor = top.budget - top.used >= p.kv_bytes
                return None, (R.RESERVATION_FLOOR if floor else R.GPU_MEMORY_INSUFFICIENT), 0.0, 0.0
            if slot.running >= self.settings.max_seqs:
                return None, R.COMPUTE_SATURATION, 0.0, 0.0  # the engine would queue it
            if (
                self.monitor.tightened
                and slot.used + p.kv_bytes > self.settings.hysteresis.high * slot.budget
                and (p.cls > 0 or self.fair.over_share(p.tenant, flags.fair_share_tolerance))
            ):
                return None, R.TIGHTENED, 0.0, 0.0
        cost = slot.costs[p.model]
        n = slot.running + 1.0
        if p.cls == CLASS_IDLE and flags.sla_fit and not self._idle_capacity(
            slot, cost, p, n, now
        ):
            return None, R.COMPUTE_SATURATION, 0.0, 0.0  # no idle capacity for overage
        raw = cost.predict(p.prompt_tokens, p.expected_out, n)
        pred = raw * self._buffer(p.model)
        if sla and flags.sla_fit and now + pred > p.deadline:
            return None, R.COMPUTE_SATURATION, raw, pred
        return slot, R.ADMITTED, raw, pred

    def _held_off(self, p: Pending, slot: GpuSlot, end: float) -> bool:
        """Would `p` on `slot`, ending at `end`, take memory a held head waits for?
        Memory inside `p`'s own model's floor never is (the head's model can never have
        it), nor, on a held GPU, memory `p` gives back before the head is due to fit."""
        if self.flags.hold_one_gpu:
            hold = self.holds.get(slot.index)
            if hold is None or hold[0] == p.request_id or end <= hold[1]:
                return False
        elif not self.held:
            return False
        return not slot.within_floor(p.model, p.kv_bytes)

    def _fit_elsewhere(
        self, p: Pending, now: float
    ) -> tuple[GpuSlot | None, ReasonCode, float, float]:
        """`p` is held off the GPU it fit best: the checks again on the GPUs no head
        holds (hold_one_gpu), or nowhere (the whole pool is held)."""
        if not self.flags.hold_one_gpu:
            return None, R.GPU_MEMORY_INSUFFICIENT, 0.0, 0.0
        return self._fit(p, now, unheld=True)

    def _hold(self, p: Pending, now: float) -> None:
        """`p`, an aged head short of KV, holds the line: the pool, or one GPU no other
        head holds (the one it held at the last pass, else the one predicted to free
        room for it first). With every GPU held, no GPU is left to it: it waits."""
        if not self.flags.hold_one_gpu:
            self.held = p.model
            return
        holds = self.holds
        last = self._last_holds.get(p.request_id)
        if last is not None and last[0] not in holds and self.ledger.slots[last[0]].up:
            holds[last[0]] = (p.request_id, last[1])
            return
        free = [s for s in self.ledger.slots if s.up and s.index not in holds]
        if not free:
            return  # every GPU is held: skip the scan of the runners
        slot, at = soonest_fit(p, free, self.inflight.values(), now)
        if slot is not None:
            holds[slot.index] = (p.request_id, at)

    def _idle_capacity(
        self, slot: GpuSlot, cost: CostModel, p: Pending, n: float, now: float
    ) -> bool:
        """Would over-quota `p` on `slot` leave every in-quota runner there inside its
        SLA? Its decode step grows with the batch and stretches by the share of time
        the GPU spends in (recent and this) prefills, which stall every decode."""
        stall = self._prefill_share(slot, now) + (
            p.prompt_tokens * cost.prefill_s_per_token / PREFILL_WINDOW_S
        )
        if stall >= IDLE_MAX_STALL:
            return False
        return cost.decode_step(n) / (1.0 - stall) <= self._step_budget(slot)

    def _prefill_share(self, slot: GpuSlot, now: float) -> float:
        """Share of recent time `slot` spent prefilling (decayed sum over the window)."""
        dt = now - slot.prefill_at
        if dt > 0.0:
            slot.prefill_load *= math.exp(-dt / PREFILL_WINDOW_S)
            slot.prefill_at = now
        return slot.prefill_load / PREFILL_WINDOW_S

    def _step_budget(self, slot: GpuSlot) -> float:
        """The slowest decode step the in-quota requests running on `slot` tolerate (each
        still ends inside its SLA as predicted at its dispatch): over-quota work may
        only use capacity that slows nobody within quota into a miss."""
        heap = slot.step_budgets
        inflight = self.inflight
        while heap:
            budget, seq, r = heap[0]
            assert isinstance(r, Pending)
            if r.seq == seq and r.gpu is slot and inflight.get(r.request_id) is r:
                return budget
            heappop(heap)
        return 1e18

    def _round_robin(self) -> GpuSlot | None:
        slots = self.ledger.slots
        n = len(slots)
        for _ in range(n):
            self._rr = (self._rr + 1) % n
            s = slots[self._rr]
            if s.up:
                return s
        return None

    # --- outcomes -------------------------------------------------------------------
    def _dispatch(
        self, p: Pending, slot: GpuSlot, raw: float, pred: float, now: float,
        reason: ReasonCode, out: list[Decision],
    ) -> None:
        p.dispatch_n = slot.running + 1.0
        self.ledger.reserve(slot, p.model, p.tenant, p.kv_bytes)
        if p.overage and reason is R.ADMITTED:
            reason = R.ADMITTED_OVERAGE
        p.gpu = slot
        p.dispatched_at = now
        p.predicted_raw_s = raw
        p.predicted_s = pred
        p.predicted_end = now + pred
        self.inflight[p.request_id] = p
        t = p.tenant
        self.tenant_running[t] = self.tenant_running.get(t, 0) + 1
        self.fair.charge(t, p.expected_tokens, p.pressure, now)
        self.queue.refresh(t, self.fair.key(t))
        if self.flags.preemption:
            self.runners.push(p)
        flags = self.flags
        self._prefill_share(slot, now)
        slot.prefill_load += p.prompt_tokens * slot.costs[p.model].prefill_s_per_token
        if p.cls == 0 and flags.sla_fit and pred > 0.0:
            # the decode step it tolerates: its slack over its prediction, times the
            # step the prediction assumed
            cost = slot.costs[p.model]
            budget = (p.deadline - now) / pred * cost.decode_step(p.dispatch_n)
            heappush(slot.step_budgets, (budget, p.seq, p))
            if len(slot.step_budgets) > 4 * slot.running + 64:
                self._compact_budgets(slot)
        self.stats.dispatched += 1
        out.append(Decision(
            p.request_id, t, p.model, self.pool, ACCEPT, reason, now, p.attempt, slot.gpu_id,
            pred, (now - p.enqueued_at) if p.enqueued_at >= 0.0 else 0.0, None, flags.name,
            flags.version, p.expected_tokens, None, None, None, p.kv_bytes, None,
            self._buffer(p.model), p.sla_s, p.deadline - now, None, None, None, p.overage,
            None, None, p.recompute_tokens or None, None, None, None,
        ))

    def _compact_budgets(self, slot: GpuSlot) -> None:
        inflight = self.inflight
        live = []
        for e in slot.step_budgets:
            r = e[2]
            assert isinstance(r, Pending)
            if r.seq == e[1] and r.gpu is slot and inflight.get(r.request_id) is r:
                live.append(e)
        heapify(live)
        slot.step_budgets = live

    def _queue_or_refuse(
        self, p: Pending, reason: ReasonCode, now: float, out: list[Decision]
    ) -> None:
        q = self.queue
        if not self.flags.queue:
            self._refuse(p, reason, now, self._drain_s(q.work_s), out)
            return
        pool_room, tenant_room = q.has_room(p.tenant)
        if not tenant_room:
            self._refuse(
                p, R.TENANT_QUEUE_FULL, now, self._drain_s(q.tenant_work_s.get(p.tenant, 0.0)), out
            )
            return
        if not pool_room:
            self._refuse(p, R.QUEUE_FULL, now, self._drain_s(q.work_s), out)
            return
        self._enqueue(p, now)
        self.stats.queued += 1
        out.append(self._about(p, QUEUE, reason, now))

    def _enqueue(self, p: Pending, now: float) -> None:
        p.enqueued_at = now
        p.expires_at = now + self.settings.max_queue_wait_s.get(p.tenant, 2.0)
        p.timeout_reason = 0
        if self.flags.sla_fit:
            latest_start = p.deadline - p.idle_s
            if latest_start < p.expires_at:
                p.expires_at = latest_start if latest_start > now else now
                p.timeout_reason = 1
        self.queue.push(p, self.fair.service.get(p.tenant, 0.0), p.idle_s)

    def _refuse(
        self, p: Pending, reason: ReasonCode, now: float, retry_s: float | None,
        out: list[Decision], *, predicted_s: float | None = None, detail: str | None = None,
    ) -> list[Decision]:
        self.fair.leave(p.tenant)
        self._settle(p, 0.0)
        self.stats.rejected += 1
        out.append(self._about(
            p, REJECT, reason, now, retry_after_s=retry_s, predicted_s=predicted_s, detail=detail,
        ))
        return out

    def _settle(self, p: Pending, used: float) -> None:
        """`p` leaves: its charge becomes what it used (nothing unless it completed)."""
        charged = p.charged
        if charged > 0.0:
            self.settlements.append((p.tenant, charged - used))
            p.charged = 0.0

    def _about(
        self, p: Pending, outcome: Outcome, reason: ReasonCode, now: float, *,
        retry_after_s: float | None = None, predicted_s: float | None = None,
        detail: str | None = None,
    ) -> Decision:
        """A decision about a request that is not being dispatched, with the numbers."""
        flags = self.flags
        room = None
        if reason in _MEMORY_REASONS:
            room = self.ledger.peek(p.model)[1]
        q = self.queue
        return Decision(
            p.request_id, p.tenant, p.model, self.pool, outcome, reason, now, p.attempt,
            None, predicted_s, (now - p.enqueued_at) if p.enqueued_at >= 0.0 else None,
            retry_after_s, flags.name, flags.version, p.expected_tokens, None, None, None,
            p.kv_bytes, room, self._buffer(p.model) if flags.sla_fit else None, p.sla_s,
            p.deadline - now, q.tenant_count.get(p.tenant, 0) - 1 if outcome is QUEUE else None,
            len(q.members), self.fair.service.get(p.tenant, 0.0), p.overage,
            self.monitor.utilization, self.monitor.tightened, p.recompute_tokens or None,
            None, None, detail,
        )

    def _drain_s(self, work_s: float) -> float:
        """Predicted time for the queue ahead to drain: queued work over the pool's
        parallelism (GPUs up x sequences each runs), at least one tick."""
        up = self.ledger.up_count()
        if up == 0:
            return 60.0
        per_gpu = len(self.inflight) / up
        return max(0.05, work_s / (up * max(1.0, per_gpu)))

    # --- completions ----------------------------------------------------------------
    def complete(
        self, *, request_id: str, attempt: int, ok: bool, output_tokens: int, prefill_s: float,
        decode_s: float, concurrency: float, now: float, preempted: bool = False,
        error: str | None = None,
    ) -> list[Decision]:
        """A worker finished an attempt. Frees its reservation, trains the predictor and
        dispatches what now fits."""
        out: list[Decision] = []
        p = self.inflight.get(request_id)
        if p is None or p.attempt != attempt:
            self._stale_completion(request_id, attempt, ok and not preempted, now, out)
            return out
        self._release(p)
        if preempted:  # stopped by the worker itself (shutdown): run it again
            self._requeue(p, now, R.GPU_LOST, out)
        else:
            self.fair.leave(p.tenant)
            slot = p.gpu
            assert isinstance(slot, GpuSlot)
            self._settle(p, float(p.prompt_tokens + output_tokens) if ok else 0.0)
            if ok and self.flags.clairvoyant:
                self.stats.completed += 1  # the true model needs no learning
            elif ok:
                self.stats.completed += 1
                self.predictor.observe(
                    tenant=p.tenant, model=p.model, gpu_type=slot.gpu_type,
                    prompt_tokens=p.prompt_tokens, output_tokens=output_tokens,
                    max_tokens=p.max_tokens, prefill_s=prefill_s, decode_s=decode_s,
                    concurrency=concurrency, expected_out=p.expected_out,
                    dispatch_concurrency=p.dispatch_n,
                )
            else:
                self.stats.failed += 1
            out.append(Decision(
                p.request_id, p.tenant, p.model, self.pool, COMPLETE,
                R.COMPLETED if ok else R.FAILED, now, attempt=attempt, gpu_id=slot.gpu_id,
                predicted_s=p.predicted_s, policy=self.flags.name,
                policy_version=self.flags.version, sla_s=p.sla_s, slack_s=p.deadline - now,
                output_tokens=output_tokens, latency_s=now - p.arrived, detail=error,
                recompute_tokens=p.recompute_tokens or None,
            ))
        self._dispatch_pass(now, out)
        return out

    def _stale_completion(
        self, request_id: str, attempt: int, ok: bool, now: float, out: list[Decision]
    ) -> None:
        """A completion for an attempt we preempted: if it finished anyway, it counts and the
        newer attempt is withdrawn (from the queue, or cancelled on its GPU)."""
        if not ok:
            return
        queued = self.queue.members.get(request_id)
        running = self.inflight.get(request_id)
        p = queued or running
        if p is None or p.attempt <= attempt:
            return  # unknown or duplicate completion: the first one stood
        cancelled_gpu: str | None = None
        if queued is not None:
            self.queue.remove(queued, self.fair.key(queued.tenant), 0.0)
        elif running is not None:
            slot = running.gpu
            assert isinstance(slot, GpuSlot)
            cancelled_gpu = slot.gpu_id
            self._release(running)
        self.fair.leave(p.tenant)
        self._settle(p, float(p.prompt_tokens) + p.expected_out)
        self.stats.completed += 1
        out.append(Decision(
            p.request_id, p.tenant, p.model, self.pool, COMPLETE, R.COMPLETED, now,
            attempt=p.attempt, gpu_id=cancelled_gpu, policy=self.flags.name,
            policy_version=self.flags.version, latency_s=now - p.arrived,
            detail=f"attempt {attempt} finished before its preemption took effect"
            + (f"; attempt {p.attempt} cancelled" if cancelled_gpu else ""),
        ))

    def _release(self, p: Pending) -> None:
        slot = p.gpu
        assert isinstance(slot, GpuSlot)
        self.ledger.release(slot, p.model, p.tenant, p.kv_bytes)
        del self.inflight[p.request_id]
        n = self.tenant_running.get(p.tenant, 1) - 1
        if n > 0:
            self.tenant_running[p.tenant] = n
        else:
            self.tenant_running.pop(p.tenant, None)
        if len(self.runners) > 2 * len(self.inflight) + 256:
            self.runners.compact(self.inflight)

    def _requeue(self, p: Pending, now: float, reason: ReasonCode, out: list[Decision]) -> None:
        """Back to the queue after a preemption or a lost GPU, paying its prefill again."""
        elapsed = now - p.dispatched_at
        progress = min(1.0, elapsed / p.predicted_raw_s) if p.predicted_raw_s > 0 else 0.0
        recompute = p.prompt_tokens + int(p.expected_out * progress)
        p.recompute_tokens += recompute
        self.stats.recompute_tokens += recompute
        old_gpu = p.gpu
        assert isinstance(old_gpu, GpuSlot)
        old_attempt = p.attempt
        p.attempt += 1
        self._seq += 1
        p.seq = self._seq
        p.gpu = None
        pool_room, tenant_room = self.queue.has_room(p.tenant)
        if reason is R.GPU_LOST and not (pool_room and tenant_room):
            self._refuse(
                p, R.GPU_LOST, now, self._drain_s(self.queue.work_s), out,
                detail=f"GPU {old_gpu.gpu_id} was lost and the queue is full",
            )
            return
        self._enqueue(p, now)
        out.append(Decision(
            p.request_id, p.tenant, p.model, self.pool, PREEMPT, reason, now,
            attempt=old_attempt, gpu_id=old_gpu.gpu_id, predicted_s=p.predicted_s,
            policy=self.flags.name, policy_version=self.flags.version,
            recompute_tokens=recompute, queue_depth=len(self.queue), sla_s=p.sla_s,
            slack_s=p.deadline - now,
        ))

    # --- the queue ------------------------------------------------------------------
    def _dispatch_pass(self, now: float, out: list[Decision]) -> None:
        """Start queued requests in fairness order while they fit: the first request that
        fits, across lanes in fairness order and inside each lane past its blocked head
        (work-conserving, like VTC), within the lookahead bounds."""
        q = self.queue
        self.held = ""
        if self.holds or self._last_holds:
            self._last_holds = {rid: (i, at) for i, (rid, at) in self.holds.items()}
            self.holds = {}
        if not q.members:
            return
        aside: list[object] = []
        skipped = 0
        limits = self.settings.max_concurrency if self.flags.quota else {}
        backfill = self.flags.backfill_s
        depth = self.flags.lane_lookahead - 1
        held = ""  # model of an aged head that holds the whole pool (hold_scope: pool)
        try:
            while True:
                p = q.head_request()
                if p is None:
                    break
                limit = limits.get(p.tenant)
                if (limit is not None and self.tenant_running.get(p.tenant, 0) >= limit) or (
                    held and p.model == held
                ):
                    entry = q.set_aside()
                    if entry is not None:
                        aside.append(entry)
                    continue
                reason = self._try_start(p, now, out)
                if reason is None:
                    continue
                # blocked: look past it, unless it has waited long (no starvation). Only a
                # head short of KV holds the line: holding others back frees its memory. A
                # head short of time (compute saturation) gains nothing from a stalled
                # queue, and holding the line there convoys the pool behind it. Even a
                # held line lets other models start inside their own floors: memory the
                # head's model can never have.
                if self.strict:
                    break
                aged = (
                    now - p.enqueued_at > backfill
                    and reason is not R.TIGHTENED and reason is not R.COMPUTE_SATURATION
                )
                if aged and not held:  # holding one GPU each, every aged head holds
                    self._hold(p, now)
                    held = self.held
                if depth > 0 and not (held and p.model == held) and self._start_behind(
                    p, reason, now, depth, out
                ):
                    continue  # its lane was served and re-keyed: look again from the top
                skipped += 1
                if skipped >= self.flags.lookahead:
                    break
                if held and not any(self.settings.model_floors.values()):
                    break
                entry = q.set_aside()
                if entry is not None:
                    aside.append(entry)
        finally:
            for entry in aside:
                q.put_back(entry)

    def _try_start(self, p: Pending, now: float, out: list[Decision]) -> ReasonCode | None:
        """Dispatch queued `p` if it fits (preempting for it if the rule says so): None
        when it started, else why it is blocked."""
        slot, reason, raw, pred = self._fit(p, now)
        if slot is None and self.flags.preemption and _preempts_for(reason):
            slot, raw, pred = self._preempt_for(p, now, out)
        if slot is not None and self._held_off(p, slot, now + pred):  # the held head's memory
            slot, reason, raw, pred = self._fit_elsewhere(p, now)
        if slot is None:
            return reason
        self.queue.remove(p, self.fair.key(p.tenant), self._queued_work(p), rekeyed=True)
        self._dispatch(p, slot, raw, pred, now, R.DISPATCHED_FROM_QUEUE, out)
        return None

    def _start_behind(
        self, head: Pending, reason: ReasonCode, now: float, depth: int, out: list[Decision]
    ) -> bool:
        """The lane's head is blocked for `reason`: start the first of the next `depth`
        requests of its lane that fits. Requests no smaller than the head (same model,
        no more slack) are skipped without a check: they cannot fit where it did not."""
        limit = self.settings.max_concurrency.get(head.tenant) if self.flags.quota else None
        memory = reason is not R.COMPUTE_SATURATION
        held = self.held
        for c in self.queue.behind(head, depth):
            if held and c.model == held:
                continue
            if limit is not None and self.tenant_running.get(c.tenant, 0) >= limit:
                return False
            if c.model == head.model:
                if memory and c.kv_bytes >= head.kv_bytes:
                    continue
                if (
                    not memory and c.prompt_tokens >= head.prompt_tokens
                    and c.expected_out >= head.expected_out and c.deadline <= head.deadline
                ):
                    continue
            if self._try_start(c, now, out) is None:
                return True
        return False

    @staticmethod
    def _queued_work(p: Pending) -> float:
        return p.idle_s

    def _preempt_for(
        self, q: Pending, now: float, out: list[Decision]
    ) -> tuple[GpuSlot | None, float, float]:
        """Apply the preemption rule to the runners with the most remaining time."""
        factor = self.flags.preempt_sla_factor
        slack = q.deadline - now
        latest = self.runners.latest_end(self.inflight)
        if latest is None or slack >= factor * (latest - now):
            return None, 0.0, 0.0  # no runner has enough remaining time to qualify
        q_key = (q.cls, self.fair.key(q.tenant))
        for r in self.runners.candidates(self.inflight, PREEMPT_CANDIDATES):
            remaining = r.predicted_end - now
            if slack >= factor * remaining:
                break  # the rest have even less remaining time
            r_key = (r.cls, self.fair.key(r.tenant))
            if not should_preempt(
                queued_outranks=outranks(q_key, r_key, q.tenant == r.tenant),
                queued_slack_s=slack, runner_remaining_s=remaining, factor=factor,
            ):
                continue
            _, tenant_room = self.queue.has_room(r.tenant)
            if not tenant_room:
                continue
            slot = r.gpu
            assert isinstance(slot, GpuSlot)
            freed = slot.avail(q.model, q.tenant) + r.kv_bytes
            if freed < q.kv_bytes:
                continue
            raw = slot.costs[q.model].predict(q.prompt_tokens, q.expected_out, float(slot.running))
            pred = raw * self._buffer(q.model)
            if self.flags.sla_fit and now + pred > q.deadline:
                continue
            self._release(r)
            if slot.avail(q.model, q.tenant) < q.kv_bytes:  # floors made it not fit after all
                self.ledger.reserve(slot, r.model, r.tenant, r.kv_bytes)
                self.inflight[r.request_id] = r
                self.tenant_running[r.tenant] = self.tenant_running.get(r.tenant, 0) + 1
                continue
            self.stats.preemptions += 1
            self._requeue(r, now, R.PREEMPTED_FOR_PRIORITY, out)
            return slot, raw, pred
        return None, 0.0, 0.0

    # --- time and health ------------------------------------------------------------
    def tick(self, now: float) -> list[Decision]:
        """Expire what waited too long, check GPU liveness, move the hysteresis monitor,
        then dispatch what fits."""
        out: list[Decision] = []
        q = self.queue
        for p in q.pop_expired(now):
            if self._last_chance(p, now, out):
                continue
            q.remove(p, self.fair.key(p.tenant), self._queued_work(p))
            self.fair.leave(p.tenant)
            self._settle(p, 0.0)
            self.stats.timed_out += 1
            reason = R.DEADLINE_UNREACHABLE if p.timeout_reason else R.QUEUE_TIMEOUT
            out.append(self._about(p, TIMEOUT, reason, now, retry_after_s=self._drain_s(q.work_s)))
        if self.expect_heartbeats:
            self._check_liveness(now, out)
        self._observe_utilization(now)
        self._dispatch_pass(now, out)
        return out

    def _last_chance(self, p: Pending, now: float, out: list[Decision]) -> bool:
        """A request of a tenant whose output length the predictor has not learned yet,
        whose max wait ran out while only the predicted time held it back (its memory
        fits, and an idle GPU would still finish it in time), starts instead of timing
        out. Its prediction rests on the prior output ratio (0.7 of max_tokens by
        default): a tenant asking for 6,000 tokens and using 900 was predicted 4x too
        long under load, every request timed out, none completed, and the predictor never
        learned otherwise. Once a few complete, the learned ratio decides: below
        saturation, a request of a tenant within its share still starts if the
        predictor's median error (not the buffer's tail) finishes it in time; timing out
        is a certain miss, and the buffered check held back requests that mostly made it
        (`azure-trace`: 85.6% of requests met without this, 88.1% with it)."""
        if p.timeout_reason or not self.flags.sla_fit or p.cls == CLASS_IDLE:
            return False
        if now + p.idle_s > p.deadline:
            return False
        learned = self.predictor.ratio(p.tenant).learned
        if learned and self.monitor.saturated:
            return False
        slot, _reason, raw, pred = self._fit(p, now, sla=False)
        if slot is None:
            return False
        if learned and (
            now + raw * self.predictor.median_ratio(p.model) > p.deadline
            or self.fair.over_share(p.tenant, self.flags.fair_share_tolerance)
        ):
            return False  # even the typical error would miss, or it is over its share
        self.queue.remove(p, self.fair.key(p.tenant), self._queued_work(p), rekeyed=True)
        self._dispatch(p, slot, raw, pred, now, R.DISPATCHED_FROM_QUEUE, out)
        return True

    def utilization(self) -> float:
        """The pool's saturation, from the core's own state (so the simulator, replay and
        the live app see the same signal): the largest of the reserved KV share, the
        share of engine sequence slots in use, and the queue's predicted drain time over
        DRAIN_HORIZON_S. Not NVML's utilization.gpu, nor a worker's busy share: under
        continuous batching those read ~100% whenever one sequence runs."""
        ledger = self.ledger
        kv = ledger.kv_utilization()
        up = ledger.up_count()
        if up == 0:
            return kv
        seqs = len(self.inflight) / float(up * self.settings.max_seqs)
        sat = kv if kv > seqs else seqs
        if self.queue.members:
            drain = self._drain_s(self.queue.work_s) / DRAIN_HORIZON_S
            sat = sat if sat > drain else drain
        return sat

    def _observe_utilization(self, now: float) -> None:
        util = self.utilization()
        up = self.ledger.up_count()
        flip = self.monitor.update(util, up, now)
        if flip is not None:
            self.scale_events.append(ScaleEvent(
                pool=self.pool, at=now, autoscale=self.monitor.autoscale,
                tightened=self.monitor.tightened, utilization=util, gpus=up, reason=flip,
            ))

    def _check_liveness(self, now: float, out: list[Decision]) -> None:
        timeout = self.settings.gpu_timeout_s
        for slot in self.ledger.slots:
            if slot.up and slot.seen and now - slot.last_heartbeat > timeout:
                self.ledger.set_up(slot, False)
                lost = [p for p in self.inflight.values() if p.gpu is slot]
                for p in lost:
                    self._release(p)
                    self._requeue(p, now, R.GPU_LOST, out)

    def heartbeat(
        self, *, gpu_id: str, gpu_type: str, speed: float, kv_budget: int,
        up: bool, now: float,
    ) -> list[Decision]:
        """A GPU reported in: capacity, utilization, and whether it takes work."""
        out: list[Decision] = []
        slot = self.ledger.by_id.get(gpu_id)
        if slot is None:
            slot = self.add_gpu(gpu_id=gpu_id, gpu_type=gpu_type, speed=speed, budget=kv_budget)
        slot.seen = True
        slot.last_heartbeat = now
        if kv_budget != slot.budget:
            self.ledger.set_budget(slot, kv_budget)
            self._largest_fits.clear()
        was_up = slot.up
        self.ledger.set_up(slot, up)
        if was_up and not up:
            for p in [p for p in self.inflight.values() if p.gpu is slot]:
                self._release(p)
                self._requeue(p, now, R.GPU_LOST, out)
        if up and not was_up:
            self._observe_utilization(now)
            self._dispatch_pass(now, out)
        return out

    def drain_scale_events(self) -> list[ScaleEvent]:
        events, self.scale_events = self.scale_events, []
        return events
