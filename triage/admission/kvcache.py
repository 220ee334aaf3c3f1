"""Check 2, KV-cache fit: the reservation ledger of one pool.

A request reserves (prompt + max_tokens) x bytes/token on one GPU at its peak;
reservations, never NVML free memory, are the ledger. Two kinds of floor hold
memory back on every GPU:

- a model's floor F_m: other models may not eat into it. Invariant per GPU:
  sum over models of max(used_m, F_m) <= budget;
- a tenant's reserved share R_t: other tenants may not eat into it. Invariant:
  sum over reserved tenants of max(used_t, R_t) + used by the others <= budget.

Both sums are kept incrementally, so "how much could model m / tenant t still
get here" is O(1). Each model has a lazy max-heap of GPUs keyed by what an
unreserved tenant could get, so choosing a GPU (worst fit: most room, which
spreads load) is O(log n).
"""

from __future__ import annotations

from collections.abc import Container

from triage.admission.errors import UnknownGpuError
from triage.admission.heaps import heapify, heappop, heappush
from triage.admission.predictor import CostModel


class GpuSlot:
    """One GPU's share of the ledger."""

    __slots__ = (
        "budget",
        "costs",
        "gpu_id",
        "gpu_type",
        "index",
        "last_heartbeat",
        "model_committed",
        "model_floor",
        "model_used",
        "prefill_at",
        "prefill_load",
        "running",
        "seen",
        "speed",
        "step_budgets",
        "tenant_committed",
        "tenant_floor",
        "tenant_used",
        "up",
        "used",
        "version",
    )

    def __init__(
        self, *, gpu_id: str, index: int, gpu_type: str, speed: float, budget: int,
        model_floor: dict[str, int], tenant_floor: dict[str, int],
    ) -> None:
        self.gpu_id = gpu_id
        self.index = index
        self.gpu_type = gpu_type
        self.speed = speed
        self.budget = budget
        self.up = True
        self.seen = False  # has sent a heartbeat
        self.last_heartbeat = 0.0
        self.running = 0  # sequences dispatched here and not finished
        self.used = 0  # reserved bytes, all models
        self.model_used: dict[str, int] = {}
        self.model_floor = model_floor
        self.model_committed = sum(model_floor.values())
        self.tenant_used: dict[str, int] = {}
        self.tenant_floor = tenant_floor
        self.tenant_committed = sum(tenant_floor.values())
        self.version = 0
        self.costs: dict[str, CostModel] = {}  # model -> cost model of this GPU type
        # (decode step time an in-quota runner here tolerates and still meets its SLA,
        # seq, request): a lazy min-heap the dispatcher keeps (entries die when it leaves)
        self.step_budgets: list[tuple[float, int, object]] = []
        # prefill seconds dispatched here, decayed (time constant PREFILL_WINDOW_S in the
        # dispatcher): a prefill stalls every decoding sequence on the GPU
        self.prefill_load = 0.0
        self.prefill_at = 0.0

    def avail_model(self, model: str) -> int:
        """Bytes model `model` could still reserve here without breaking another's floor."""
        f = self.model_floor.get(model, 0)
        u = self.model_used.get(model, 0)
        return self.budget - self.model_committed + (f - u if f > u else 0)

    def within_floor(self, model: str, nbytes: int) -> bool:
        """Would `nbytes` more for `model` stay inside its own floor here?"""
        return self.model_used.get(model, 0) + nbytes <= self.model_floor.get(model, 0)

    def avail_unreserved(self) -> int:
        """Bytes a tenant without a reserved share could still reserve here."""
        return self.budget - self.tenant_committed

    def avail(self, model: str, tenant: str) -> int:
        a = self.avail_model(model)
        f = self.tenant_floor.get(tenant, 0)
        if f:
            u = self.tenant_used.get(tenant, 0)
            b = self.budget - self.tenant_committed + (f - u if f > u else 0)
        else:
            b = self.budget - self.tenant_committed
        return a if a < b else b

    def reserve(self, model: str, tenant: str, nbytes: int) -> None:
        self._add(model, tenant, nbytes)
        self.running += 1

    def release(self, model: str, tenant: str, nbytes: int) -> None:
        self._add(model, tenant, -nbytes)
        self.running -= 1

    def _add(self, model: str, tenant: str, delta: int) -> None:
        self.used += delta
        mu = self.model_used
        u = mu.get(model, 0)
        mu[model] = u + delta
        f = self.model_floor.get(model)
        if f:
            self.model_committed += (u + delta if u + delta > f else f) - (u if u > f else f)
        else:
            self.model_committed += delta
        tud = self.tenant_used
        tu = tud.get(tenant, 0)
        tud[tenant] = tu + delta
        tf = self.tenant_floor.get(tenant)
        if tf:
            self.tenant_committed += (
                (tu + delta if tu + delta > tf else tf) - (tu if tu > tf else tf)
            )
        else:
            self.tenant_committed += delta
        self.version += 1

    def floors_hold(self) -> bool:
        """The two ledger invariants (for tests and assertions)."""
        return self.model_committed <= self.budget and self.tenant_committed <= self.budget


class PoolLedger:
    """All GPUs of one pool and the per-model heaps that pick one."""

    __slots__ = (
        "_heaps",
        "budget_up",
        "by_id",
        "model_floors",
        "models",
        "pool",
        "slots",
        "tenant_shares",
        "up",
        "used_up",
    )

    def __init__(
        self, *, pool: str, models: list[str], model_floors: dict[str, int],
        tenant_shares: dict[str, float],
    ) -> None:
        self.pool = pool
        self.models = models
        self.model_floors = {m: f for m, f in model_floors.items() if f > 0}
        self.tenant_shares = {t: s for t, s in tenant_shares.items() if s > 0}
        self.slots: list[GpuSlot] = []
        self.by_id: dict[str, GpuSlot] = {}
        self._heaps: dict[str, list[tuple[int, int, int]]] = {m: [] for m in models}
        self.budget_up = 0  # sum of budgets of GPUs that are up
        self.used_up = 0  # sum of reservations on GPUs that are up
        self.up = 0  # GPUs up

    # --- membership -----------------------------------------------------------------
    def add_gpu(self, *, gpu_id: str, gpu_type: str, speed: float, budget: int) -> GpuSlot:
        if gpu_id in self.by_id:
            return self.by_id[gpu_id]
        slot = GpuSlot(
            gpu_id=gpu_id, index=len(self.slots), gpu_type=gpu_type, speed=speed, budget=budget,
            model_floor=dict(self.model_floors),
            tenant_floor={t: int(s * budget) for t, s in self.tenant_shares.items()},
        )
        self.slots.append(slot)
        self.by_id[gpu_id] = slot
        self.budget_up += budget
        self.up += 1
        self._push(slot)
        return slot

    def slot(self, gpu_id: str) -> GpuSlot:
        try:
            return self.by_id[gpu_id]
        except KeyError:
            raise UnknownGpuError(f"GPU {gpu_id!r} is not in pool {self.pool!r}") from None

    def set_up(self, slot: GpuSlot, up: bool) -> None:
        if slot.up == up:
            return
        slot.up = up
        sign = 1 if up else -1
        self.up += sign
        self.budget_up += sign * slot.budget
        self.used_up += sign * slot.used
        slot.version += 1
        if up:
            self._push(slot)

    def set_budget(self, slot: GpuSlot, budget: int) -> None:
        """Capacity reported by a heartbeat; floors scale with the budget."""
        if budget == slot.budget or budget <= 0:
            return
        if slot.up:
            self.budget_up += budget - slot.budget
        slot.budget = budget
        slot.tenant_floor = {t: int(s * budget) for t, s in self.tenant_shares.items()}
        slot.tenant_committed = sum(
            max(slot.tenant_used.get(t, 0), slot.tenant_floor.get(t, 0))
            for t in set(slot.tenant_used) | set(slot.tenant_floor)
        )
        slot.version += 1
        self._push(slot)

    # --- choosing a GPU ---------------------------------------------------------------
    def peek(self, model: str) -> tuple[GpuSlot | None, int]:
        """The GPU with the most room for `model` (for an unreserved tenant), and that room."""
        heap = self._heaps[model]
        slots = self.slots
        while heap:
            negk, ver, idx = heap[0]
            s = slots[idx]
            if ver == s.version and s.up:
                return s, -negk
            heappop(heap)
        return None, 0

    def best(self, model: str, tenant: str, nbytes: int) -> GpuSlot | None:
        """The up GPU with the most room for this model and tenant, if it has `nbytes`."""
        s, room = self.peek(model)
        if s is None:
            return None
        if room >= nbytes:
            return s
        if tenant in self.tenant_shares:  # reserved slack is not in the heap key: look
            return self.scan(model, tenant, nbytes)
        return None

    def scan(
        self, model: str, tenant: str, nbytes: int, skip: Container[int] = ()
    ) -> GpuSlot | None:
        """`best` by looking at every up GPU, except those whose index is in `skip`."""
        best: GpuSlot | None = None
        best_a = nbytes - 1
        for s in self.slots:
            if s.up and s.index not in skip:
                a = s.avail(model, tenant)
                if a > best_a:
                    best, best_a = s, a
        return best

    def largest_fit(self, model: str, tenant: str) -> int:
        """The largest reservation an empty GPU could give `model` for `tenant`, given the
        floors other models and tenants hold."""
        best = 0
        for s in self.slots:
            others_m = sum(f for m, f in s.model_floor.items() if m != model)
            others_t = sum(f for t, f in s.tenant_floor.items() if t != tenant)
            best = max(best, s.budget - max(others_m, others_t))
        return best

    # --- reservations -------------------------------------------------------------------
    def reserve(self, slot: GpuSlot, model: str, tenant: str, nbytes: int) -> None:
        slot.reserve(model, tenant, nbytes)
        if slot.up:
            self.used_up += nbytes
        self._push(slot)

    def release(self, slot: GpuSlot, model: str, tenant: str, nbytes: int) -> None:
        slot.release(model, tenant, nbytes)
        if slot.up:
            self.used_up -= nbytes
        self._push(slot)

    def kv_utilization(self) -> float:
        return self.used_up / self.budget_up if self.budget_up > 0 else 1.0

    def up_count(self) -> int:
        return self.up

    def _push(self, slot: GpuSlot) -> None:
        if not slot.up:
            return
        unreserved = slot.budget - slot.tenant_committed
        base = slot.budget - slot.model_committed
        floors = slot.model_floor
        used = slot.model_used
        ver = slot.version
        idx = slot.index
        push = heappush
        limit = 4 * len(self.slots) + 64
        for m, heap in self._heaps.items():
            f = floors.get(m)
            a = base
            if f:
                u = used.get(m, 0)
                if f > u:
                    a += f - u
            push(heap, (-(a if a < unreserved else unreserved), ver, idx))
            if len(heap) > limit:
                self._rebuild(m)

    def _rebuild(self, model: str) -> None:
        heap = []
        for s in self.slots:
            if s.up:
                a = min(s.avail_model(model), s.budget - s.tenant_committed)
                heap.append((-a, s.version, s.index))
        heapify(heap)
        self._heaps[model] = heap
