"""One pool's state and where a request fits: the base of the pool's dispatcher.

`PoolPlacement` holds what a pool's dispatcher owns (ledger, queue, fairness, runners,
hysteresis, holds) and answers checks 2 and 3 for one request: the best GPU it fits
on in memory and in time, whether it would take memory an aged queue head holds, and
whether over-quota work finds idle capacity. It decides nothing: the layers above
(`outcomes.py`, `serving.py`, `dispatcher.py`) act on its answers. Nothing here reads
a clock or does I/O.
"""

from __future__ import annotations

import math
from typing import Final

from triage.admission.decision import ScaleEvent
from triage.admission.fairness import FairShare
from triage.admission.heaps import heapify, heappop
from triage.admission.holding import soonest_fit
from triage.admission.hysteresis import HysteresisMonitor, HysteresisSettings
from triage.admission.kvcache import GpuSlot, PoolLedger
from triage.admission.pending import CLASS_IDLE, Pending
from triage.admission.policy import ORDER_FIFO, PolicyFlags
from triage.admission.predictor import CostModel, WorkloadPredictor
from triage.admission.preemption import RunnerHeap
from triage.admission.queue import PoolQueue
from triage.topics.reasons import ReasonCode
from triage.topics.reasons import ReasonCode as R

# Module names are Final so the compiled build reads them from C statics (any other
# global costs a dict lookup on every use); R is an import alias for the same reason.

# time constant of a GPU's recent prefill work (its prefills stall every decode there)
PREFILL_WINDOW_S: Final = 5.0
# Idle capacity for over-quota work: the GPU spends under this share of its time in
# prefills (each stalls every decode there); the in-quota runners must also keep their
# SLA slack (_idle_capacity).
IDLE_MAX_STALL: Final = 0.15
# queued work that takes this long to drain reads as a saturated pool (hysteresis)
DRAIN_HORIZON_S: Final = 10.0


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
        "result_timeout_s",
        "tenant_queue_max",
        "tenant_shares",
        "tenant_sla_s",
        "tightest_sla_s",
        "weights",
    )

    def __init__(
        self, *, name: str, kv_bytes_per_token: dict[str, int], model_floors: dict[str, int],
        tenant_shares: dict[str, float], weights: dict[str, float], queue_max: int,
        tenant_queue_max: dict[str, int], max_queue_wait_s: dict[str, float],
        max_concurrency: dict[str, int], hysteresis: HysteresisSettings, gpu_timeout_s: float,
        max_seqs: int = 256, tenant_sla_s: dict[str, float] | None = None,
        result_timeout_s: float = 600.0,
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
        self.result_timeout_s = result_timeout_s  # no result this long: run it again
        self.max_seqs = max_seqs  # sequences one GPU's engine runs at once
        self.tenant_sla_s = tenant_sla_s or {}  # contracted SLAs of the pool's tenants
        self.tightest_sla_s = min(self.tenant_sla_s.values(), default=0.0)


class DispatcherStats:
    """Counters a dispatcher keeps for metrics and the simulator's report."""

    __slots__ = (
        "completed",
        "cut_late",
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
        self.cut_late = 0  # runners stopped past their deadline (cancel_late; in timed_out)

    @property
    def preemption_rate(self) -> float:
        """Preemptions per dispatch (the seed's canary: worry above 2%)."""
        return self.preemptions / self.dispatched if self.dispatched else 0.0


class PoolPlacement:
    """One pool's state, and checks 2 and 3 (KV fit, SLA fit) against it."""

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
        self._results_checked = float("-inf")  # when runners were last checked for results
        self._results_since = 0.0  # results are awaited from then on (dispatcher.py)
        self._largest_fits: dict[tuple[str, str], int] = {}  # (model, tenant) -> largest fit
        # (tenant, tokens) to give back to the gate's buckets: what requests that left were
        # charged beyond what they used (negative: used more). The core drains it.
        self.settlements: list[tuple[str, float]] = []
        self.held = ""  # model whose memory an aged, KV-blocked queue head holds
        # hold_one_gpu: GPU index -> (the aged head holding it, when it is due to fit);
        # rebuilt by each dispatch pass, the last pass's kept to keep a head's GPU stable
        self.holds: dict[int, tuple[str, float]] = {}
        # cancel_late: runners by deadline, (deadline, seq, request); entries of requests
        # that left are dropped as they come up (outcomes.py keeps the heap bounded)
        self.deadlines: list[tuple[float, int, object]] = []
        self._last_holds: dict[str, tuple[int, float]] = {}

    # --- membership of GPUs -----------------------------------------------------------
    def add_gpu(self, *, gpu_id: str, gpu_type: str, speed: float, budget: int) -> GpuSlot:
        slot = self.ledger.add_gpu(gpu_id=gpu_id, gpu_type=gpu_type, speed=speed, budget=budget)
        for m in self.settings.kv_bytes_per_token:
            slot.costs[m] = self.predictor.cost_model(m, gpu_type)
        self._largest_fits.clear()
        return slot

    # --- predictions ------------------------------------------------------------------
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

    def _drain_s(self, work_s: float) -> float:
        """Predicted time for the queue ahead to drain: queued work over the pool's
        parallelism (GPUs up x sequences each runs), at least one tick."""
        up = self.ledger.up_count()
        if up == 0:
            return 60.0
        per_gpu = len(self.inflight) / up
        return max(0.05, work_s / (up * max(1.0, per_gpu)))

    # --- the checks -------------------------------------------------------------------
    def _hold_tolerance(self, tenant: str) -> float:
        """How far over its fair share `tenant` may be before a tightened pool holds it
        back. The hold keeps KV headroom for tight-SLA arrivals; holding a tight-SLA
        tenant at the same mark defeats it (its requests wait out short deadlines: the
        30 s `agent` tenant of `long-context` was held 350 times). So tight-SLA tenants
        (contracted SLA within `tight_sla_ratio` x the pool's tightest) are held only
        beyond `tight_share_tolerance`; a dominant tight tenant far over its share is
        still held. Judged by the contracted SLA, not a request's own `sla_ms`, which a
        client could set low to slip past the hold."""
        f = self.flags
        sla = self.settings.tenant_sla_s.get(tenant)
        if sla is not None and sla <= f.tight_sla_ratio * self.settings.tightest_sla_s:
            return f.tight_share_tolerance
        return f.fair_share_tolerance

    def _past_mark(self, slot: GpuSlot, nbytes: int) -> bool:
        """Would `nbytes` more take `slot` past the high mark (where a tightened pool
        holds back over-share and over-quota work)?"""
        return slot.used + nbytes > self.settings.hysteresis.high * slot.budget

    def _share_held(self, tenant: str) -> bool:
        """Is `tenant` far enough over its fair share for a tightened pool to hold it?"""
        return self.fair.over_share(tenant, self._hold_tolerance(tenant))

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
                self.monitor.tightened and self._past_mark(slot, p.kv_bytes)
                and (p.cls > 0 or self._share_held(p.tenant))
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
        while heap:
            budget, seq, r = heap[0]
            if self._running(r, seq, slot):
                return budget
            heappop(heap)
        return 1e18

    def _running(self, r: object, seq: int, slot: GpuSlot | None = None) -> bool:
        """Is a heap entry's request (`r`, pushed at its dispatch numbered `seq`) still
        running that attempt (on `slot`, if given)? The step-budget and deadline heaps
        drop entries lazily: a request that finished, was preempted or requeued since
        leaves its entry behind."""
        assert isinstance(r, Pending)
        return (r.seq == seq and (slot is None or r.gpu is slot)
                and self.inflight.get(r.request_id) is r)

    def _compacted(
        self, entries: list[tuple[float, int, object]], slot: GpuSlot | None = None
    ) -> list[tuple[float, int, object]]:
        """`entries` without those `_running` drops, as a heap again."""
        live = [e for e in entries if self._running(e[2], e[1], slot)]
        heapify(live)
        return live

    def _round_robin(self) -> GpuSlot | None:
        slots = self.ledger.slots
        n = len(slots)
        for _ in range(n):
            self._rr = (self._rr + 1) % n
            s = slots[self._rr]
            if s.up:
                return s
        return None

    # --- saturation -------------------------------------------------------------------
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
