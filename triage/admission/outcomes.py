"""What happens to a request once a pool's dispatcher has decided: the bookkeeping of
each outcome (start on a GPU, wait, refuse, leave, go back to the queue) and the
decision record that reports it. The decisions themselves are made above, in
`serving.py` and `dispatcher.py`. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from typing import Final

from triage.admission.decision import ACCEPT, PREEMPT, QUEUE, REJECT, Decision
from triage.admission.heaps import heappush
from triage.admission.kvcache import GpuSlot
from triage.admission.pending import Pending
from triage.admission.placement import PoolPlacement
from triage.topics.reasons import Outcome, ReasonCode
from triage.topics.reasons import ReasonCode as R

# Module names are Final so the compiled build reads them from C statics (any other
# global costs a dict lookup on every use); R is an import alias for the same reason.
_MEMORY_REASONS: Final = frozenset(
    {R.GPU_MEMORY_INSUFFICIENT, R.RESERVATION_FLOOR, R.NO_CAPACITY, R.TIGHTENED}
)


class PoolOutcomes(PoolPlacement):
    """The outcomes of one pool's requests, and their decision records."""

    # --- starting ---------------------------------------------------------------------
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
                slot.step_budgets = self._compacted(slot.step_budgets, slot)
        if flags.cancel_late:
            heap = self.deadlines
            heappush(heap, (p.deadline, p.seq, p))
            if len(heap) > 4 * len(self.inflight) + 64:
                self.deadlines = self._compacted(heap)
        self.stats.dispatched += 1
        out.append(Decision(
            p.request_id, t, p.model, self.pool, ACCEPT, reason, now, p.attempt, slot.gpu_id,
            pred, (now - p.enqueued_at) if p.enqueued_at >= 0.0 else 0.0, None, flags.name,
            flags.version, p.expected_tokens, None, None, None, p.kv_bytes, None,
            self._buffer(p.model), p.sla_s, p.deadline - now, None, None, None, p.overage,
            None, None, p.recompute_tokens or None, None, None, None,
        ))

    # --- waiting and refusing ---------------------------------------------------------
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
        self._leave(p, 0.0)
        self.stats.rejected += 1
        out.append(self._about(
            p, REJECT, reason, now, retry_after_s=retry_s, predicted_s=predicted_s, detail=detail,
        ))
        return out

    def _leave(self, p: Pending, used: float) -> None:
        """`p` leaves the pool for good (refused, timed out, completed, cut): its tenant
        has one request fewer in the fair order, and its charge becomes what it used
        (nothing unless it ran)."""
        self.fair.leave(p.tenant)
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

    # --- leaving a GPU ----------------------------------------------------------------
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
        lost = reason is R.GPU_LOST or reason is R.RESULT_OVERDUE
        if lost and not (pool_room and tenant_room):
            what = "was lost" if reason is R.GPU_LOST else "sent no result in time"
            self._refuse(
                p, reason, now, self._drain_s(self.queue.work_s), out,
                detail=f"GPU {old_gpu.gpu_id} {what} and the queue is full",
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
