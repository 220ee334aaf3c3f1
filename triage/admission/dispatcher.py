"""The dispatcher of one pool: single owner of the pool's ledger and queue.

It composes checks 2-5 (KV fit, SLA fit, fairness, prediction), the bounded
queue, preemption and hysteresis, in layers: `placement.py` holds the pool's state
and where a request fits, `outcomes.py` the bookkeeping of each outcome,
`serving.py` the dispatch pass and preemption, and this module the handlers the
core calls (arrivals, completions, heartbeats, ticks, recovery). Handlers take `now`
and return decisions; nothing here reads a clock or does I/O.

Dispatch order: an arrival may start at once only if the queue is empty or it
outranks the queue's head; otherwise it waits its turn (`serving.py` says how the
queue is served).
"""

from __future__ import annotations

from typing import Final

from triage.admission.decision import COMPLETE, TIMEOUT, Decision, ScaleEvent
from triage.admission.heaps import heappop, heappush
from triage.admission.kvcache import GpuSlot
from triage.admission.pending import Pending
from triage.admission.serving import QueueServing
from triage.topics.reasons import ReasonCode as R

RESULT_CHECK_S: Final = 1.0  # how often running requests are checked for overdue results
# A longer gap between checks means the app was not running (just started and
# recovered its runners, or stalled): results may sit unread, so the clock starts again.
RESULT_GAP_S: Final = 10.0
# cancel_late stops a late runner once it has also run this many times its (buffered)
# predicted time: one just past its deadline is likely near its end, and stopping it
# throws that work away for little (two-services@120's 3 s tenant lost 1.4 points of
# weighted SLA when every late runner was stopped at its deadline)
CUT_PAST_PREDICTION: Final = 1.5


class Dispatcher(QueueServing):
    """Owns one pool: ledger, queue, fairness, runners, hysteresis."""

    # --- recovery ---------------------------------------------------------------------
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

    # --- arrivals ---------------------------------------------------------------------
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
            self._leave(p, 0.0)
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

    # --- completions ------------------------------------------------------------------
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
            slot = p.gpu
            assert isinstance(slot, GpuSlot)
            self._leave(p, float(p.prompt_tokens + output_tokens) if ok else 0.0)
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
        self._leave(p, float(p.prompt_tokens) + p.expected_out)
        self.stats.completed += 1
        out.append(Decision(
            p.request_id, p.tenant, p.model, self.pool, COMPLETE, R.COMPLETED, now,
            attempt=p.attempt, gpu_id=cancelled_gpu, policy=self.flags.name,
            policy_version=self.flags.version, latency_s=now - p.arrived,
            detail=f"attempt {attempt} finished before its preemption took effect"
            + (f"; attempt {p.attempt} cancelled" if cancelled_gpu else ""),
        ))

    # --- time and health --------------------------------------------------------------
    def tick(self, now: float) -> list[Decision]:
        """Expire what waited too long, check GPU liveness, move the hysteresis monitor,
        then dispatch what fits."""
        out: list[Decision] = []
        q = self.queue
        for p in q.pop_expired(now):
            if self._last_chance(p, now, out):
                continue
            q.remove(p, self.fair.key(p.tenant), self._queued_work(p))
            self._leave(p, 0.0)
            self.stats.timed_out += 1
            reason = R.DEADLINE_UNREACHABLE if p.timeout_reason else R.QUEUE_TIMEOUT
            out.append(self._about(p, TIMEOUT, reason, now, retry_after_s=self._drain_s(q.work_s)))
        if self.expect_heartbeats:
            self._check_liveness(now, out)
        if self.flags.cancel_late and self.monitor.tightened:
            self._cut_late(now, out)
        self._observe_utilization(now)
        self._dispatch_pass(now, out)
        return out

    def _cut_late(self, now: float, out: list[Decision]) -> None:
        """While the pool is tightened, stop the runners whose deadline has passed and
        that have run CUT_PAST_PREDICTION x their predicted time: each has missed its
        SLA already, and what it has left to run takes GPU time from requests that can
        still meet theirs (`tenants13@100`: 13,187 of the dominant tenant's misses were
        late completions, docs/experiments.md). The request is answered `timeout`, its
        attempt stopped on its GPU; the variance buffer learns the time it ran, a lower
        bound (`observe_cut`), so cutting the slow ones does not leave it taught by the
        fast ones only. Below saturation late work runs to its end: it takes nothing
        anyone is waiting for."""
        heap = self.deadlines
        while heap and heap[0][0] < now:
            _deadline, seq, r = heappop(heap)
            if not self._running(r, seq):
                continue
            assert isinstance(r, Pending)
            ripe = r.dispatched_at + CUT_PAST_PREDICTION * r.predicted_s
            if ripe > now:  # late, but maybe near its end: look again then
                heappush(heap, (ripe, seq, r))
                continue
            slot = r.gpu
            assert isinstance(slot, GpuSlot)
            elapsed = now - r.dispatched_at
            made = self.predictor.observe_cut(
                model=r.model, gpu_type=slot.gpu_type,
                prompt_tokens=r.prompt_tokens, max_tokens=r.max_tokens, elapsed_s=elapsed,
                expected_out=r.expected_out, dispatch_concurrency=r.dispatch_n,
                concurrency=float(slot.running),
            )
            self._release(r)
            self._leave(r, float(r.prompt_tokens + made))
            self.stats.timed_out += 1
            self.stats.cut_late += 1
            out.append(Decision(
                r.request_id, r.tenant, r.model, self.pool, TIMEOUT, R.DEADLINE_UNREACHABLE,
                now, attempt=r.attempt, gpu_id=slot.gpu_id, predicted_s=r.predicted_s,
                policy=self.flags.name, policy_version=self.flags.version, sla_s=r.sla_s,
                slack_s=r.deadline - now, latency_s=now - r.arrived,
                recompute_tokens=r.recompute_tokens or None,
                detail=f"still running {now - r.deadline:.3f}s past its SLA deadline on a "
                "saturated pool: stopped",
            ))

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
        if now >= self._results_checked + RESULT_CHECK_S:
            if now - self._results_checked > RESULT_GAP_S:
                self._results_since = now
            self._results_checked = now
            since = self._results_since
            overdue = [p for p in self.inflight.values()
                       if now - (p.dispatched_at if p.dispatched_at > since else since)
                       > self._result_limit(p)]
            for p in overdue:
                self._release(p)
                self._requeue(p, now, R.RESULT_OVERDUE, out)

    def _result_limit(self, p: Pending) -> float:
        """How long `p` may run with no result before it is run again: the configured
        floor, or twice its whole max_tokens on a GPU running all the sequences it can,
        if that is longer (a long generation is not cut short)."""
        slot = p.gpu
        assert isinstance(slot, GpuSlot)
        s = self.settings
        worst = 2.0 * slot.costs[p.model].predict(p.prompt_tokens, float(p.max_tokens),
                                                  float(s.max_seqs))
        return worst if worst > s.result_timeout_s else s.result_timeout_s

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
