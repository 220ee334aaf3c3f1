"""The discrete-event loop: the admission core drives simulated GPUs in virtual time.

Four event sources, each with one pending time, picked smallest first (ties in
this order, so a run is a pure function of its inputs and seed):

1. GPU events: a heap of (time, gpu index) from each SimulatedGpu's
   next_event_time; an entry is live only while it equals the GPU's `sched`
   (a later or earlier reschedule leaves a stale entry that is skipped);
2. metric samples on the series grid;
3. core ticks every policy.tick_ms (skipped while the whole system is idle and
   relaxed, which changes nothing the core could observe);
4. arrivals, pulled one at a time from the workload or trace stream.

Decisions are applied as a worker and a client would: ACCEPT submits to the GPU,
PREEMPT aborts the running attempt, a COMPLETE that cancels a newer attempt
aborts it, and every finished sequence is reported back through core.complete.
Only live requests are held (`_live`, `_by_key`); both are empty after a run.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from triage.admission.core import AdmissionCore
from triage.admission.decision import (
    ACCEPT,
    COMPLETE,
    PREEMPT,
    QUEUE,
    REJECT,
    TIMEOUT,
    Decision,
)
from triage.admission.heaps import heappop, heappush
from triage.config.models import PolicyConfig, TriageConfig
from triage.sim.errors import SimError
from triage.sim.gpu import (
    EngineQueueFullError,
    FinishedSequence,
    SeqKey,
    SequenceRejectedError,
    SimulatedGpu,
    gpu_from_config,
)
from triage.sim.metrics import TenantStats
from triage.sim.result import SimResult, build_result
from triage.sim.series import TimeSeries
from triage.sim.workload import Arrival
from triage.topics.reasons import ReasonCode, stopped_running

log = logging.getLogger(__name__)

INF: Final = math.inf
ProgressFn = Callable[[float, int], None]  # (virtual now, arrivals so far)
DecisionsFn = Callable[[list[Decision], float], None]  # every batch the core returns, with now
EventFn = Callable[[float], None]  # after each event is fully handled, with its time


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    """How to run (not what to run): seeds, noise, sampling, limits."""

    seed: int = 0
    gpu_noise: float = 0.0  # lognormal sigma of the GPUs' timing noise
    sample_s: float = 1.0  # time-series interval (doubles when a run outgrows max_points)
    max_points: int = 2048
    max_num_seqs: int | None = None  # engine batch limit per GPU (None: the pool's)
    drain_limit_s: float = 3600.0  # after the last arrival, give up on requests still live
    progress_every: int = 8192  # arrivals between progress callbacks


class _Gpu:
    """A simulated GPU with its scheduling state in the event loop."""

    __slots__ = ("busy_mark", "dirty", "engine", "index", "pool", "sched")

    def __init__(self, engine: SimulatedGpu, index: int, pool: str) -> None:
        self.engine = engine
        self.index = index
        self.pool = pool
        self.sched = INF  # time of its live heap entry (INF: none)
        self.dirty = False  # touched since its next event was computed
        self.busy_mark = 0.0  # busy_seconds at the last sample


class _Live:
    """A request between its arrival and its terminal outcome."""

    __slots__ = (
        "admitted", "arrived", "attempt", "fin", "gpu", "key", "max_tokens", "model", "output",
        "pool", "prompt", "queued", "rid", "sla_s", "stats",
    )  # fmt: skip

    def __init__(self, rid: str, a: Arrival, pool: str, sla_s: float, stats: TenantStats) -> None:
        self.rid = rid
        self.arrived = a.t
        self.model = a.model
        self.pool = pool
        self.prompt = a.prompt_tokens
        self.max_tokens = a.max_tokens
        self.output = a.output_tokens
        self.sla_s = sla_s
        self.stats = stats
        self.admitted = False
        self.queued = False
        self.gpu: _Gpu | None = None  # where its current attempt runs
        self.key = -1  # engine key of its current attempt
        self.attempt = 0
        self.fin: FinishedSequence | None = None  # the run being reported as complete


class Simulator:
    """One scenario under one policy. `run()` once; it returns the SimResult."""

    def __init__(
        self, config: TriageConfig, arrivals: Iterable[Arrival], *,
        policy: PolicyConfig | None = None, options: SimOptions | None = None,
        scenario: str = "", policy_name: str | None = None, progress: ProgressFn | None = None,
        on_decisions: DecisionsFn | None = None, on_event: EventFn | None = None,
    ) -> None:
        # on_decisions / on_event: probes for tests and experiments (audit every decision,
        # check invariants after every event); they must not change the simulator.
        self.on_decisions = on_decisions
        self.on_event = on_event
        self.options = opts = options or SimOptions()
        if opts.max_num_seqs is not None and any(
            p.max_num_seqs != opts.max_num_seqs for p in config.pools
        ):  # the core must know the engines' concurrency: one figure for both
            data = config.model_dump()
            for pool in data["pools"]:
                pool["max_num_seqs"] = opts.max_num_seqs
            config = TriageConfig.model_validate(data)
        self.config = config
        self.policy = policy or config.policy
        self.policy_name = policy_name or self.policy.name
        self.scenario = scenario
        self.progress = progress
        self.core = AdmissionCore(config, policy=self.policy)
        self._arrivals = arrivals
        self.series = TimeSeries(interval=opts.sample_s, max_points=opts.max_points)
        self.tenants = {
            t.name: TenantStats(t.name, t.weight, self.series) for t in config.tenants
        }
        self._sla = {t.name: t.sla_ms / 1000.0 for t in config.tenants}
        self.gpus: list[_Gpu] = []
        ttft = self.core.flags.engine_queue_ttft_s
        for pool in config.pools:
            gt = config.gpu_type(pool.gpu_type)
            models = config.models_of_pool(pool.name)
            # the engine_queue_cap baseline: queued prompt tokens a target TTFT drains
            cap = int(ttft * gt.speed / min(m.prefill_s_per_token for m in models)) if (
                ttft is not None and models
            ) else 0
            for gid in pool.gpus:
                i = len(self.gpus)
                eng = gpu_from_config(
                    config, gid, noise=opts.gpu_noise, seed=opts.seed * 7919 + i,
                    max_queued_tokens=cap,
                )
                self.gpus.append(_Gpu(eng, i, pool.name))
        self._by_id = {g.engine.gpu_id: g for g in self.gpus}
        self._live: dict[str, _Live] = {}
        self._by_key: dict[SeqKey, tuple[_Live, int]] = {}  # engine key -> (request, attempt)
        self._heap: list[tuple[float, int]] = []
        self._dirty: list[_Gpu] = []
        self._next_key = 0
        self.decisions = 0
        self.arrivals = 0
        self.now = 0.0
        self._last_sample = 0.0
        self._ran = False

    # --- the loop -------------------------------------------------------------------
    def run(self) -> SimResult:
        if self._ran:
            raise SimError("a Simulator runs once; build another for another run")
        self._ran = True
        wall0 = time.perf_counter()
        # Everything built before the run (imports, config, core, GPUs) outlives it, so
        # the collections the run's allocations trigger need not rescan it.
        gc.freeze()
        try:
            self._loop()
        finally:
            gc.unfreeze()
        return build_result(self, wall_s=time.perf_counter() - wall0)

    def _loop(self) -> None:
        core = self.core
        tick_s = self.policy.tick_ms / 1000.0
        tick_k = 1
        next_tick = tick_s
        next_sample = self.series.interval
        heap = self._heap
        live = self._live
        dirty = self._dirty
        it = iter(self._arrivals)
        nxt = next(it, None)
        last_arrival = 0.0
        every = self.options.progress_every
        pending_progress = every
        probe = self.on_event
        while True:
            if probe is not None:
                probe(self.now)
            ta = nxt.t if nxt is not None else INF
            if nxt is None and not live:
                break
            tg = heap[0][0] if heap else INF
            if tg <= ta and tg <= next_tick and tg <= next_sample:
                t, idx = heappop(heap)
                g = self.gpus[idx]
                if g.sched != t:
                    continue
                g.sched = INF
                self.now = t
                eng = g.engine
                for fs in eng.advance(t):
                    self._finish(fs, t)
                te = eng.next_event_time()
                if te is not None and te < g.sched:
                    g.sched = te
                    heappush(heap, (te, idx))
                if dirty:
                    self._settle(t)
            elif next_sample <= ta and next_sample <= next_tick:
                self._sample(next_sample)
                dt = self.series.interval
                next_sample = (math.floor(next_sample / dt + 1e-9) + 1) * dt
            elif next_tick <= ta:
                now = self.now = next_tick
                self._apply(core.tick(now), now)
                if dirty:
                    self._settle(now)
                tick_k += 1
                if not live and nxt is not None and self._relaxed():
                    tick_k = max(tick_k, int(ta / tick_s))
                next_tick = tick_k * tick_s
                if nxt is None and now - last_arrival > self.options.drain_limit_s:
                    self._give_up()
                    break
            else:
                assert nxt is not None
                now = self.now = ta
                last_arrival = ta
                self._arrive(nxt, now)
                if dirty:
                    self._settle(now)
                nxt = next(it, None)
                pending_progress -= 1
                if pending_progress <= 0 and self.progress is not None:
                    pending_progress = every
                    self.progress(now, self.arrivals)
        self._sample(self.now)
        if self.progress is not None:
            self.progress(self.now, self.arrivals)

    @property
    def live_requests(self) -> int:
        """Requests (and engine attempts) the simulator still holds: 0 after a run."""
        return len(self._live) + len(self._by_key)

    def _relaxed(self) -> bool:
        return not any(
            d.monitor.tightened or d.monitor.autoscale for d in self.core.dispatchers.values()
        )

    def _give_up(self) -> None:
        log.warning(
            "%s/%s: %d requests still live %.0fs after the last arrival; counted unfinished",
            self.scenario, self.policy_name, len(self._live), self.options.drain_limit_s,
        )
        for lv in self._live.values():
            lv.stats.unfinished += 1
        self._live.clear()
        self._by_key.clear()

    # --- arrivals and decisions -----------------------------------------------------
    def _arrive(self, a: Arrival, now: float) -> None:
        self.arrivals += 1
        rid = a.request_id or f"r{self.arrivals}"
        if rid in self._live:
            raise SimError(f"request id {rid!r} arrived twice while live (dedupe a replay first)")
        stats = self.tenants[a.tenant]
        stats.arrive(now, a.prompt_tokens, a.output_tokens)
        sla = a.sla_s if a.sla_s is not None else self._sla[a.tenant]
        pool = self.core.pool_of_model[a.model]
        lv = _Live(rid, a, pool, sla, stats)
        self._live[rid] = lv
        self._apply(
            self.core.submit(
                rid, a.tenant, a.model, a.prompt_tokens, a.max_tokens, now, a.sla_s,
                true_output=a.output_tokens,
            ),
            now,
        )

    def _apply(self, decisions: list[Decision], now: float) -> None:
        """Carry out the core's decisions (more may be appended while iterating)."""
        self.decisions += len(decisions)
        if self.on_decisions is not None:
            self.on_decisions(decisions, now)
        live = self._live
        i = 0
        while i < len(decisions):
            d = decisions[i]
            i += 1
            lv = live.get(d.request_id)
            if lv is None:
                continue
            o = d.outcome
            if o is ACCEPT:
                self._start(lv, d, now, decisions)
            elif o is QUEUE:
                if not lv.queued:
                    lv.queued = True
                    lv.stats.queue(str(d.reason))  # StrEnum: its value, minus Enum.value's lookup
            elif o is COMPLETE:
                self._completed(lv, d, now)
            elif o is REJECT:
                lv.stats.reject(str(d.reason), now, d.retry_after_s)
                self._end(lv)
            elif o is TIMEOUT:
                if stopped_running(o, d.gpu_id):
                    self._stop_attempt(lv, now)
                lv.stats.timeout(str(d.reason), now, d.retry_after_s)
                self._end(lv)
            elif o is PREEMPT:
                self._preempted(lv, d, now)

    def _start(self, lv: _Live, d: Decision, now: float, decisions: list[Decision]) -> None:
        g = self._by_id[d.gpu_id or ""]
        key = self._next_key
        self._next_key = key + 1
        lv.key, lv.attempt, lv.gpu = key, d.attempt, g
        if not lv.admitted:
            lv.admitted = True
            lv.stats.admitted += 1
        self._by_key[key] = (lv, d.attempt)
        try:
            g.engine.submit(
                key, model=lv.model, prompt_tokens=lv.prompt, output_tokens=lv.output, now=now
            )
        except EngineQueueFullError as exc:  # the engine refuses it: a rejection
            del self._by_key[key]
            lv.gpu = None
            lv.stats.reject("queue_full", now, None)
            self._end(lv)
            decisions.extend(self.core.complete(
                pool=lv.pool, request_id=lv.rid, attempt=d.attempt, ok=False, output_tokens=0,
                prefill_s=0.0, decode_s=0.0, concurrency=1.0, now=now, error=str(exc),
            ))
            return
        except SequenceRejectedError as exc:  # admit-all sent what the GPU can never hold
            del self._by_key[key]
            lv.gpu = None
            decisions.extend(self.core.complete(
                pool=lv.pool, request_id=lv.rid, attempt=d.attempt, ok=False, output_tokens=0,
                prefill_s=0.0, decode_s=0.0, concurrency=1.0, now=now, error=str(exc),
            ))
            return
        if not g.dirty:
            g.dirty = True
            self._dirty.append(g)

    def _preempted(self, lv: _Live, d: Decision, now: float) -> None:
        """The core requeued a running attempt: stop it on its GPU."""
        st = lv.stats
        st.core_preemptions += 1
        st.recompute_core += d.recompute_tokens or 0
        if lv.attempt == d.attempt:
            self._stop_attempt(lv, now)

    def _stop_attempt(self, lv: _Live, now: float) -> None:
        """Abort `lv`'s current attempt on its GPU (a preemption, or a request the core
        stopped past its deadline)."""
        g = lv.gpu
        if g is None:
            return
        fs = g.engine.abort(lv.key, now)
        if fs is not None:
            del self._by_key[lv.key]
            self._engine_costs(lv.stats, fs)
        # else it finished at this instant: its result is reported (stale) when drained
        lv.gpu = None
        if not g.dirty:
            g.dirty = True
            self._dirty.append(g)

    def _completed(self, lv: _Live, d: Decision, now: float) -> None:
        st = lv.stats
        fs = lv.fin
        if d.reason is ReasonCode.FAILED or fs is None:
            st.fail()
        else:
            st.complete(
                arrived=lv.arrived, sla_s=lv.sla_s, tokens=lv.prompt + fs.output_tokens,
                started=fs.started_at if fs.started_at is not None else fs.finished_at,
                first_token=(
                    fs.first_token_at if fs.first_token_at is not None else fs.finished_at
                ),
                finished=fs.finished_at,
                prompt=lv.prompt, predicted_s=d.predicted_s, run_s=fs.prefill_s + fs.decode_s,
            )
        g = lv.gpu
        if g is not None and lv.key in g.engine:  # a newer attempt is cancelled
            aborted = g.engine.abort(lv.key, now)
            self._by_key.pop(lv.key, None)
            if aborted is not None:
                self._engine_costs(st, aborted)
            if not g.dirty:
                g.dirty = True
                self._dirty.append(g)
        self._end(lv)

    def _end(self, lv: _Live) -> None:
        del self._live[lv.rid]

    @staticmethod
    def _engine_costs(st: TenantStats, fs: FinishedSequence) -> None:
        if fs.engine_preemptions:
            st.engine_preemptions += fs.engine_preemptions
            st.recompute_engine += fs.recomputed_tokens

    # --- GPUs -----------------------------------------------------------------------
    def _settle(self, now: float) -> None:
        """Drain finished sequences of touched GPUs and reschedule their next events."""
        dirty = self._dirty
        heap = self._heap
        while dirty:
            g = dirty.pop()
            g.dirty = False
            eng = g.engine
            for fs in eng.advance(now):
                self._finish(fs, now)
            t = eng.next_event_time()
            if t is not None and t < g.sched:
                g.sched = t
                heappush(heap, (t, g.index))

    def _finish(self, fs: FinishedSequence, now: float) -> None:
        entry = self._by_key.pop(fs.key, None)
        if entry is None:
            return
        lv, attempt = entry
        self._engine_costs(lv.stats, fs)
        lv.fin = fs
        # prefill as the engine ran it: time waiting in the engine's own queue is not
        # prefill work, and learning it as such inflates the cost model under load
        self._apply(self.core.complete(
            pool=lv.pool, request_id=lv.rid, attempt=attempt, ok=True,
            output_tokens=fs.output_tokens, prefill_s=fs.prefill_s - fs.queue_s,
            decode_s=fs.decode_s, concurrency=fs.mean_concurrency, now=now,
        ), now)

    # --- sampling -------------------------------------------------------------------
    def _sample(self, t: float) -> None:
        """Gauges for the slot ending at t (utilization over the time since the last)."""
        for g in self.gpus:
            g.dirty = True
            self._dirty.append(g)
        self._settle(t)
        span = t - self._last_sample
        s = self.series
        at = t - 1e-9 if t > 0 else 0.0
        for pool, d in self.core.dispatchers.items():
            gs = [g for g in self.gpus if g.pool == pool]
            busy = 0.0
            used = 0
            budget = 0
            waiting = 0
            for g in gs:
                e = g.engine
                busy += e.busy_seconds - g.busy_mark
                g.busy_mark = e.busy_seconds
                used += e.kv_used_bytes
                budget += e.kv_budget_bytes
                waiting += e.waiting
            if span > 0 and gs:
                s.set(f"busy:{pool}", at, busy / (span * len(gs)))
            s.set(f"queue:{pool}", at, float(len(d.queue)))
            s.set(f"engine_queue:{pool}", at, float(waiting))
            s.set(f"kv_reserved:{pool}", at, d.ledger.kv_utilization())
            s.set(f"kv_used:{pool}", at, used / budget if budget else 0.0)
            s.set(f"tightened:{pool}", at, 1.0 if d.monitor.tightened else 0.0)
            s.set(f"autoscale:{pool}", at, 1.0 if d.monitor.autoscale else 0.0)
        self._last_sample = t


def simulate(
    config: TriageConfig, arrivals: Iterable[Arrival], *, policy: PolicyConfig | None = None,
    options: SimOptions | None = None, scenario: str = "", policy_name: str | None = None,
    progress: ProgressFn | None = None,
) -> SimResult:
    """Run one policy over one arrival stream (see Simulator)."""
    return Simulator(
        config, arrivals, policy=policy, options=options, scenario=scenario,
        policy_name=policy_name, progress=progress,
    ).run()
