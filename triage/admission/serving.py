"""Serving a pool's queue: the dispatch pass and the preemption rule.

A dispatch pass (after a completion, a heartbeat or on a tick) serves the queue in
fairness order, looking past at most `lookahead` blocked tenants and, inside a lane,
past its blocked head, and never past a head that has waited more than `backfill_s`
(so big requests are not starved by small ones slipping by; a tightened head is the
exception: it waits by design). A queued request short of KV memory may preempt
runners with much more remaining time. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from typing import Final

from triage.admission.decision import Decision
from triage.admission.kvcache import GpuSlot
from triage.admission.outcomes import PoolOutcomes
from triage.admission.pending import CLASS_IDLE, Pending
from triage.admission.preemption import outranks, should_preempt
from triage.topics.reasons import ReasonCode
from triage.topics.reasons import ReasonCode as R

# Module names are Final so the compiled build reads them from C statics (any other
# global costs a dict lookup on every use); R is an import alias for the same reason.
PREEMPT_CANDIDATES: Final = 4


def _preempts_for(reason: ReasonCode) -> bool:
    """May a head blocked for `reason` preempt? Preemption frees KV memory; a head short
    of time gains little from one fewer neighbour and the victim pays its prefill again,
    so only memory shortage preempts. (Identity tests, not `in` a tuple: that compares
    strings on every blocked head.)"""
    return reason is R.GPU_MEMORY_INSUFFICIENT or reason is R.RESERVATION_FLOOR


class QueueServing(PoolOutcomes):
    """The dispatch pass over one pool's queue, preemption, and the last chance."""

    # --- the dispatch pass ------------------------------------------------------------
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
        if slot is not None and self._held_off(p, slot, now + pred):  # the held head's memory
            slot, reason, raw, pred = self._fit_elsewhere(p, now)
        if slot is None and self.flags.preemption and _preempts_for(reason):
            # after the hold check: a runner is stopped only for a request that then
            # starts in its place (_preempt_for skips held GPUs)
            slot, raw, pred = self._preempt_for(p, now, out)
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
        # A head the tightened pool holds back (R.TIGHTENED) was refused on the GPU with
        # the most room, which every smaller request of its model and tenant is offered
        # too: those that would take that GPU past the high mark are refused alike, so
        # they are passed over without the checks (the same verdict, found for less: at
        # saturation most looks behind a head end this way). Looked up once, when needed.
        look = reason is R.TIGHTENED
        top: GpuSlot | None = None
        over = False
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
                if look and c.tenant == head.tenant:
                    if top is None:
                        look = False  # once: the head's GPU, and whether its tenant is held
                        peeked, room = self.ledger.peek(head.model)
                        if peeked is not None and room >= head.kv_bytes:
                            look, top, over = True, peeked, self._share_held(head.tenant)
                    if top is not None and (over or c.cls > 0) and self._past_mark(
                        top, c.kv_bytes
                    ):
                        continue
            if self._try_start(c, now, out) is None:
                return True
        return False

    @staticmethod
    def _queued_work(p: Pending) -> float:
        return p.idle_s

    # --- preemption -------------------------------------------------------------------
    def _preempt_for(
        self, q: Pending, now: float, out: list[Decision]
    ) -> tuple[GpuSlot | None, float, float]:
        """Apply the preemption rule to the runners with the most remaining time. A
        preemption must pay and must end: `q` starts on the freed GPU at once (never on
        one a held head waits for), only if it is then predicted to meet its deadline
        (whatever `sla_fit` says: a start that misses anyway pays nothing), and a runner
        started at this same instant is never a victim. Without these a pass could loop
        for ever at one `now`: two tenants whose fair keys swap with each dispatch
        preempted each other in turn (`sla_fit: false`), and a runner stopped for a
        request that then did not start restarted and was stopped again, each round
        appending decisions until the process ran out of memory."""
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
            if r.dispatched_at >= now:
                continue  # started in this very pass: stopping it now would undo a start
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
            if now + pred > q.deadline or self._held_off(q, slot, now + pred):
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

    # --- expiry -----------------------------------------------------------------------
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
