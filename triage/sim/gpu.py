"""A continuous-batching GPU timing model: pure, event-driven, O(log n) per event.

Used in two places: the worker's ``sim`` backend drives it in (scaled) wall time, and
the virtual-time simulator drives it at hundreds of thousands of events per second.
So it owns no clock and does no I/O: every mutating call takes ``now`` (seconds,
non-decreasing), and nothing loops over tokens.

The engine, like vLLM without a front door:

* ``submit`` puts a sequence at the tail of the engine's FIFO. The head starts when
  its current KV (``(prompt + generated) x bytes/token``) fits beside what running
  sequences hold and fewer than ``max_num_seqs`` run. No skipping: a big head blocks.
* A started sequence prefills ``prompt + generated`` tokens at
  ``prefill_s_per_token / speed`` each. Prefills run one after another and stall the
  whole decode batch while they run (prefill interference); a sequence's first token
  is the end of its first prefill. A stall once scheduled is not shortened by an abort
  (the engine has already batched that work), which keeps prefills out of the event
  queue: a sequence costs two events, its submit and its finish.
* Running sequences decode in lockstep, one token per step. A step takes
  ``sum over models m present of decode_s_per_token(m) / speed x
  (1 + batch_slowdown(m) x (n_m - 1))`` plus ``kv_read_s_per_gib x KV GiB / speed``.
  With one model this is exactly the configured prior; with several, each model's
  engine takes its step in turn (time-slicing, so mixing models costs both). The KV
  term (memory bandwidth of attention; 0 by default) is read when the batch changes.
* Progress is fluid between events: a global step counter ``S`` runs at ``1 / step``
  while the batch is unchanged (and stands still during a prefill stall); a sequence
  finishes at ``join_step + remaining`` (kept in a heap), so time jumps from event to
  event.
* KV grows by one token per decoding sequence per step. If it would exceed the budget
  (admission did not reserve the peak), the most recently started sequence is
  preempted back to the head of the queue and must prefill prompt + generated tokens
  again; those count as ``recomputed_tokens``. After an overflow the engine starts
  nothing until some sequence leaves (as vLLM skips the waiting queue in a step that
  preempted): otherwise the victim would refit at once and thrash.
* ``noise > 0`` multiplies each prefill, and each batch's step time (drawn when the
  batch changes), by a seeded lognormal factor with mean 1 and sigma ``noise``, so a
  predictor has error to learn. Splitting ``advance`` calls changes nothing.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Mapping
from statistics import NormalDist
from typing import ClassVar, Final

from triage.admission.heaps import heappop, heappush
from triage.admission.record import Record
from triage.config.models import GIB, ModelConfig, TriageConfig

SeqKey = str | int

_FINISH: Final = 0
_OVERFLOW: Final = 1
_RESYNC_EVERY: Final = 1024  # batch changes between exact recomputations of the KV sum
_NOISE_LEVELS: Final = 4096
# Normal quantiles at cell midpoints: a noise draw is one random() and one lookup.
_Z: Final = [NormalDist().inv_cdf((i + 0.5) / _NOISE_LEVELS) for i in range(_NOISE_LEVELS)]


class EngineQueueFullError(ValueError):
    """The engine's queue holds its cap of prompt tokens (vLLM's max_num_queued_tokens):
    the request is refused, as such an engine refuses it (the engine_queue_cap baseline)."""


class SequenceRejectedError(ValueError):
    """A submit the engine can never serve (unknown model, duplicate key, too large)."""


_FINISHED_FIELDS = (
    "key", "model", "prompt_tokens", "output_tokens", "submitted_at", "started_at",
    "first_token_at", "finished_at", "mean_concurrency", "recomputed_tokens",
    "engine_preemptions", "aborted",
)


class FinishedSequence(Record):
    """How one sequence ended: completed, or aborted from outside with partial progress.

    An immutable value record (triage.admission.record): one per sequence, so it must
    be cheap to build at a million sequences per simulation.
    """

    __slots__ = _FINISHED_FIELDS
    _fields: ClassVar[tuple[str, ...]] = _FINISHED_FIELDS

    def __init__(
        self,
        key: SeqKey,
        model: str,
        prompt_tokens: int,
        output_tokens: int,
        submitted_at: float,
        started_at: float | None,
        first_token_at: float | None,
        finished_at: float,
        mean_concurrency: float,
        recomputed_tokens: int,
        engine_preemptions: int,
        aborted: bool,
    ) -> None:
        self.key: Final = key
        self.model: Final = model
        self.prompt_tokens: Final = prompt_tokens
        # tokens generated: all of them when completed, so far when aborted
        self.output_tokens: Final = output_tokens
        self.submitted_at: Final = submitted_at
        # first time it left the engine queue (None: aborted while waiting)
        self.started_at: Final = started_at
        self.first_token_at: Final = first_token_at  # end of its first prefill (None: before)
        self.finished_at: Final = finished_at  # completion or abort time
        # running sequences per decode step of this one (incl. itself)
        self.mean_concurrency: Final = mean_concurrency
        self.recomputed_tokens: Final = recomputed_tokens  # prefilled again (engine preemptions)
        self.engine_preemptions: Final = engine_preemptions  # evictions on KV overflow
        self.aborted: Final = aborted

    @property
    def prefill_s(self) -> float:
        """Time to first token, from submission (engine queueing included, as clients see)."""
        end = self.first_token_at if self.first_token_at is not None else self.finished_at
        return end - self.submitted_at

    @property
    def decode_s(self) -> float:
        """First token to the end (stalls and recompute included)."""
        if self.first_token_at is None:
            return 0.0
        return self.finished_at - self.first_token_at

    @property
    def queue_s(self) -> float:
        """Time spent in the engine's queue before the first start."""
        start = self.started_at if self.started_at is not None else self.finished_at
        return start - self.submitted_at


class _ModelTiming:
    """A served model's timing on this GPU, read from its (pydantic) config once: a
    config attribute read costs far more than a native one, per sequence."""

    __slots__ = ("bpt", "decode_s", "name", "prefill_s", "slowdown")

    def __init__(self, model: ModelConfig, speed: float) -> None:
        self.name = model.name
        self.decode_s = model.decode_s_per_token
        self.prefill_s = model.prefill_s_per_token / speed
        self.slowdown = model.batch_slowdown
        self.bpt = model.kv_bytes_per_token


class _Seq:
    """Mutable engine-side state of one sequence."""

    __slots__ = (
        "bpt", "conc_j", "conc_s", "decode_s", "epoch", "first_token_at", "generated",
        "join_j", "join_s", "key", "model", "output", "preemptions", "prefill_s", "prompt",
        "recomputed", "slowdown", "started_at", "submitted_at",
    )  # fmt: skip

    def __init__(self, key: SeqKey, model: _ModelTiming, prompt: int, output: int) -> None:
        self.key = key
        self.model = model.name
        self.decode_s = model.decode_s
        self.prefill_s = model.prefill_s  # seconds per prefilled token on this GPU
        self.slowdown = model.slowdown
        self.bpt = model.bpt
        self.prompt = prompt
        self.output = output
        self.generated = 0  # whole tokens generated before the current run
        self.submitted_at = 0.0
        self.started_at: float | None = None
        self.first_token_at: float | None = None
        self.join_s = 0.0  # global step when it (re)joined the batch
        self.join_j = 0.0  # batch-size integral at that step
        self.conc_j = 0.0  # accumulated batch-size integral over its runs
        self.conc_s = 0.0  # accumulated decode steps
        self.epoch = -1  # >= 0 while running: identifies its live heap entry
        self.recomputed = 0
        self.preemptions = 0


class SimulatedGpu:
    """One GPU's serving engine as a timing model. See the module docstring."""

    __slots__ = (
        "_blocked", "_busy_acc", "_busy_mark", "_changes", "_epoch", "_gpu_type", "_heap",
        "_j_anchor", "_kv_a", "_kv_b", "_kv_read", "_max_num_seqs", "_models", "_n_by_model",
        "_next_cache", "_noise_table", "_outbox", "_rand", "_recomputed", "_rng", "_running",
        "_s_anchor", "_seqs", "_speed", "_step_dt", "_t", "_t_anchor", "_waiting",
        "_waiting_live", "engine_preemptions", "gpu_id", "kv_budget_bytes", "max_queued_tokens",
    )  # fmt: skip

    def __init__(
        self,
        *,
        gpu_id: str,
        gpu_type: str,
        speed: float,
        kv_budget_bytes: int,
        models: Mapping[str, ModelConfig],
        max_num_seqs: int = 256,
        noise: float = 0.0,
        seed: int = 0,
        kv_read_s_per_gib: float = 0.0,
        max_queued_tokens: int = 0,
    ) -> None:
        if speed <= 0 or kv_budget_bytes <= 0 or max_num_seqs < 1:
            raise ValueError("speed, kv_budget_bytes and max_num_seqs must be positive")
        if noise < 0 or kv_read_s_per_gib < 0:
            raise ValueError("noise and kv_read_s_per_gib must not be negative")
        self.gpu_id = gpu_id
        self._gpu_type = gpu_type
        self._speed = speed
        self.kv_budget_bytes = kv_budget_bytes
        self._models = {name: _ModelTiming(m, speed) for name, m in models.items()}
        self._max_num_seqs = max_num_seqs
        self._rng = random.Random(seed)
        self._rand: Callable[[], float] = self._rng.random  # bound once: a draw per batch
        self._noise_table: list[float] | None = None
        if noise > 0:
            table = [math.exp(noise * z) for z in _Z]
            mean = sum(table) / len(table)
            self._noise_table = [f / mean for f in table]  # mean exactly 1
        self._kv_read = kv_read_s_per_gib / GIB / speed  # seconds per step per KV byte
        self._t = 0.0  # time the state is materialized at (the last call's now)
        self._seqs: dict[SeqKey, _Seq] = {}  # every live sequence
        self._waiting: deque[_Seq] = deque()  # engine FIFO (aborted entries skipped lazily)
        self._waiting_live = 0
        self._running: dict[SeqKey, _Seq] = {}  # in start order: the last is the newest
        self._n_by_model: dict[str, list[float]] = {}  # model -> [running, decode_s, slowdown]
        self._heap: list[tuple[float, int, _Seq]] = []  # (finish step, epoch, seq)
        self._epoch = 0
        self._s_anchor = 0.0  # global step at _t_anchor
        self._t_anchor = 0.0  # when decoding (re)starts: in the future during a prefill stall
        self._j_anchor = 0.0  # integral of batch size over steps, at _s_anchor
        self._step_dt = 1.0
        self._kv_a = 0.0  # KV bytes in use = _kv_a + _kv_b x S
        self._kv_b = 0.0
        self._changes = 0
        self._busy_acc = 0.0
        self._busy_mark = 0.0
        self._next_cache: tuple[float, int, float] | None = None
        self._outbox: list[FinishedSequence] = []
        self._blocked = False  # set by an overflow, cleared when a sequence leaves
        self.engine_preemptions = 0
        self._recomputed = 0
        self.max_queued_tokens = max_queued_tokens  # 0: the queue is unbounded

    # ---------------------------------------------------------------- readings

    @property
    def gpu_type(self) -> str:
        return self._gpu_type

    @property
    def now(self) -> float:
        """The time of the last submit/abort/advance: readings below are as of then."""
        return self._t

    @property
    def running(self) -> int:
        """Sequences holding KV (prefilling or decoding)."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Sequences in the engine's queue."""
        return self._waiting_live

    @property
    def kv_used_bytes(self) -> int:
        """KV cache in use at ``now`` (prompt + generated tokens of running sequences)."""
        return max(0, int(self._kv_a + self._kv_b * self._step_at(self._t) + 0.5))

    @property
    def busy_seconds(self) -> float:
        """Cumulative seconds the GPU prefilled or decoded, up to ``now``.

        Utilization over a window is the difference of two readings over its length.
        """
        return self._busy_acc

    @property
    def recomputed_tokens(self) -> int:
        """Tokens prefilled again after engine preemptions (KV overflow), in total."""
        return self._recomputed

    def __contains__(self, key: object) -> bool:
        return key in self._seqs

    def generated(self, key: SeqKey) -> int:
        """Tokens a sequence has generated as of ``now`` (0 while it waits or prefills;
        -1 when it is not here): what a streaming front end may show so far."""
        seq = self._seqs.get(key)
        if seq is None:
            return -1
        if seq.epoch < 0:  # waiting (again, after an engine preemption)
            return seq.generated
        run = self._step_at(self._t) - seq.join_s
        return min(seq.output, seq.generated + int(max(0.0, run) + 1e-9))

    # ---------------------------------------------------------------- commands

    def submit(
        self, key: SeqKey, *, model: str, prompt_tokens: int, output_tokens: int, now: float
    ) -> None:
        """Queue a sequence that will generate exactly ``output_tokens`` tokens."""
        entry = self._models.get(model)
        if entry is None:
            raise SequenceRejectedError(f"{self.gpu_id}: model {model!r} is not served here")
        if key in self._seqs:
            raise SequenceRejectedError(f"{self.gpu_id}: sequence {key!r} is already here")
        if prompt_tokens < 1 or output_tokens < 0:
            raise SequenceRejectedError("prompt_tokens must be >= 1 and output_tokens >= 0")
        bpt = entry.bpt
        if (prompt_tokens + output_tokens) * bpt > self.kv_budget_bytes:
            raise SequenceRejectedError(
                f"{self.gpu_id}: {prompt_tokens}+{output_tokens} tokens of {model} need "
                f"{(prompt_tokens + output_tokens) * bpt} KV bytes, budget {self.kv_budget_bytes}"
            )
        self._run_until(now)
        if self.max_queued_tokens > 0 and self._waiting_live:
            queued = prompt_tokens + sum(
                w.prompt + w.generated for w in self._waiting if self._seqs.get(w.key) is w
            )
            if queued > self.max_queued_tokens:
                raise EngineQueueFullError(
                    f"{self.gpu_id}: {queued} queued prompt tokens would exceed the engine's "
                    f"cap of {self.max_queued_tokens}"
                )
        seq = _Seq(key, entry, prompt_tokens, output_tokens)
        seq.submitted_at = now
        self._seqs[key] = seq
        self._waiting.append(seq)
        self._waiting_live += 1
        self._admit(now)

    def abort(self, key: SeqKey, now: float) -> FinishedSequence | None:
        """Stop a sequence from outside (preemption, cancel); None if unknown or done.

        The result carries the tokens generated so far; results of sequences that
        finished before ``now`` stay queued for the next ``advance``.
        """
        self._run_until(now)
        seq = self._seqs.pop(key, None)
        if seq is None:
            return None
        if seq.epoch < 0:
            self._waiting_live -= 1  # its queue entry is skipped when it reaches the head
        else:
            self._materialize(now)
            self._leave(seq, self._s_anchor)
            self._blocked = False
            self._batch_changed()
            self._admit(now)
        return self._result(seq, now, aborted=True)

    def next_event_time(self) -> float | None:
        """When the next finish or KV overflow happens; None when nothing runs."""
        nxt = self._next_cache or self._next_event()
        return None if nxt is None else nxt[0]

    def advance(self, now: float) -> list[FinishedSequence]:
        """Run the engine to ``now``; return sequences completed since the last call."""
        self._run_until(now)
        out, self._outbox = self._outbox, []
        return out

    # ---------------------------------------------------------------- events

    def _run_until(self, now: float) -> None:
        if now < self._t:
            raise ValueError(f"time went backwards: {now} < {self._t}")
        while True:
            nxt = self._next_cache or self._next_event()
            if nxt is None or nxt[0] > now:
                break
            self._handle(*nxt)
        if self._running:
            self._busy_acc += now - self._busy_mark
        self._busy_mark = self._t = now

    def _next_event(self) -> tuple[float, int, float] | None:
        """(time, kind, step) of the next finish or overflow, cached until a change."""
        if not self._running:
            return None
        heap = self._heap
        while heap[0][2].epoch != heap[0][1]:
            heappop(heap)  # stale: aborted or preempted since it was pushed
        step, kind = heap[0][0], _FINISH
        if len(self._running) > 1:  # alone, a sequence always fits (checked at submit)
            over = (self.kv_budget_bytes - self._kv_a) / self._kv_b
            if over < step:
                step, kind = over, _OVERFLOW
        s0 = self._s_anchor
        if step < s0:
            step = s0
        self._next_cache = (self._t_anchor + (step - s0) * self._step_dt, kind, step)
        return self._next_cache

    def _handle(self, t: float, kind: int, step: float) -> None:
        if self._running:
            self._busy_acc += t - self._busy_mark
        self._busy_mark = self._t = t
        self._j_anchor += len(self._running) * (step - self._s_anchor)
        self._s_anchor = step
        self._t_anchor = t
        heap, running, seqs, outbox = self._heap, self._running, self._seqs, self._outbox
        while heap and heap[0][0] <= step:
            _, epoch, seq = heappop(heap)
            if seq.epoch == epoch:
                self._leave(seq, step)
                del seqs[seq.key]
                self._blocked = False
                outbox.append(self._result(seq, t, aborted=False))
        if kind == _OVERFLOW and len(running) > 1:
            self._preempt_newest(step)
        self._batch_changed()
        self._admit(t)

    # ---------------------------------------------------------------- engine steps

    def _admit(self, now: float) -> None:
        """Start queue heads while their KV fits and the batch has room (FIFO, no skip)."""
        waiting = self._waiting
        if self._blocked or not waiting:
            return
        running, seqs = self._running, self._seqs
        kv = self._kv_a + self._kv_b * self._step_at(now)
        started = False
        while waiting and len(running) < self._max_num_seqs:
            seq = waiting[0]
            if seqs.get(seq.key) is not seq:
                waiting.popleft()  # aborted while waiting
                continue
            need = (seq.prompt + seq.generated) * seq.bpt
            if kv + need > self.kv_budget_bytes:
                break
            if not started:
                self._materialize(now)  # freeze decode progress: the prefill stalls it
                started = True
            waiting.popleft()
            self._waiting_live -= 1
            kv += need
            self._start(seq, now, need)
        if started:
            self._batch_changed()

    def _start(self, seq: _Seq, now: float, need: int) -> None:
        """Prefill (stalling the batch), then decode from the current step."""
        dur = (seq.prompt + seq.generated) * seq.prefill_s * self._noise()
        self._t_anchor = max(self._t_anchor, now) + dur  # prefills queue behind each other
        if seq.started_at is None:
            seq.started_at = now
            seq.first_token_at = self._t_anchor
        s = self._s_anchor
        seq.join_s = s
        seq.join_j = self._j_anchor
        self._kv_a += need - seq.bpt * s  # its bytes grow with S from their current size
        self._kv_b += seq.bpt
        slot = self._n_by_model.get(seq.model)
        if slot is None:
            self._n_by_model[seq.model] = [1, seq.decode_s, seq.slowdown]
        else:
            slot[0] += 1
        self._epoch += 1
        seq.epoch = self._epoch
        self._running[seq.key] = seq
        heappush(self._heap, (s + (seq.output - seq.generated), self._epoch, seq))

    def _leave(self, seq: _Seq, step: float) -> None:
        """Take a running sequence out at `step` (progress materialized up to it)."""
        del self._running[seq.key]
        run = step - seq.join_s
        seq.conc_j += self._j_anchor - seq.join_j
        seq.conc_s += run
        self._kv_a -= seq.bpt * (seq.prompt + seq.generated - seq.join_s)
        self._kv_b -= seq.bpt
        self._n_by_model[seq.model][0] -= 1
        seq.generated = min(seq.output, seq.generated + int(run + 1e-9))
        seq.epoch = -1

    def _preempt_newest(self, step: float) -> None:
        """KV overflow: evict the most recently started sequence to the queue's head."""
        seq = next(reversed(self._running.values()))
        self._leave(seq, step)
        tokens = seq.prompt + seq.generated
        seq.preemptions += 1
        seq.recomputed += tokens
        self._recomputed += tokens
        self.engine_preemptions += 1
        self._blocked = True
        self._waiting.appendleft(seq)
        self._waiting_live += 1

    # ---------------------------------------------------------------- fluid clock

    def _step_at(self, t: float) -> float:
        if t <= self._t_anchor or not self._running:
            return self._s_anchor
        return self._s_anchor + (t - self._t_anchor) / self._step_dt

    def _materialize(self, t: float) -> None:
        """Move the anchor to t (no batch change); a no-op while a prefill stall lasts."""
        if t > self._t_anchor:
            step = self._step_at(t)
            self._j_anchor += len(self._running) * (step - self._s_anchor)
            self._s_anchor = step
            self._t_anchor = t

    def _batch_changed(self) -> None:
        """New batch: new step time (and noise draw), or a clean restart when idle."""
        self._next_cache = None
        if not self._running:  # idle: restart the step clock so float error never builds up
            self._s_anchor = self._j_anchor = self._kv_a = self._kv_b = 0.0
            self._t_anchor = self._t
            self._heap.clear()
            self._blocked = False
            return
        self._changes += 1
        if self._changes % _RESYNC_EVERY == 0:
            self._resync()
        dt = 0.0
        for count, decode_s, slowdown in self._n_by_model.values():
            if count > 0:
                dt += decode_s * (1.0 + slowdown * (count - 1))
        dt /= self._speed
        if self._kv_read:
            dt += self._kv_read * (self._kv_a + self._kv_b * self._s_anchor)
        self._step_dt = dt * self._noise()

    def _resync(self) -> None:
        """Recompute the KV sum exactly (float drift under endless load)."""
        a = 0.0
        for seq in self._running.values():
            a += seq.bpt * (seq.prompt + seq.generated - seq.join_s)
        self._kv_a = a

    def _noise(self) -> float:
        table = self._noise_table
        if table is None:
            return 1.0
        return table[int(self._rand() * _NOISE_LEVELS)]

    def _result(self, seq: _Seq, now: float, *, aborted: bool) -> FinishedSequence:
        first = seq.first_token_at
        return FinishedSequence(
            seq.key,
            seq.model,
            seq.prompt,
            seq.generated,
            seq.submitted_at,
            seq.started_at,
            first if first is not None and first <= now else None,
            now,
            seq.conc_j / seq.conc_s if seq.conc_s > 0 else 1.0,
            seq.recomputed,
            seq.preemptions,
            aborted,
        )


def gpu_from_config(
    config: TriageConfig,
    gpu_id: str,
    *,
    noise: float = 0.0,
    seed: int = 0,
    max_num_seqs: int | None = None,
    kv_read_s_per_gib: float = 0.0,
    max_queued_tokens: int = 0,
) -> SimulatedGpu:
    """Build the SimulatedGpu for a configured GPU id (its pool's models, budget, speed,
    engine concurrency unless `max_num_seqs` overrides it)."""
    pool = config.pool_of_gpu(gpu_id)
    if pool is None:
        raise KeyError(f"unknown GPU {gpu_id!r}; configured: {', '.join(config.all_gpus())}")
    gtype = config.gpu_type(pool.gpu_type)
    return SimulatedGpu(
        gpu_id=gpu_id,
        gpu_type=gtype.name,
        speed=gtype.speed,
        kv_budget_bytes=int(pool.kv_budget_gib * GIB),
        models={m.name: m for m in config.models_of_pool(pool.name)},
        max_num_seqs=max_num_seqs if max_num_seqs is not None else pool.max_num_seqs,
        noise=noise,
        seed=seed,
        kv_read_s_per_gib=kv_read_s_per_gib,
        max_queued_tokens=max_queued_tokens,
    )


__all__ = [
    "EngineQueueFullError",
    "FinishedSequence",
    "SeqKey",
    "SequenceRejectedError",
    "SimulatedGpu",
    "gpu_from_config",
]
