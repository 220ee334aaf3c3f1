"""The ``sim`` backend: the GPU timing model (triage.sim.gpu) run in scaled wall time.

One engine loop owns the SimulatedGpu: it advances the model to "now", resolves the
attempts that finished, and sleeps until the model's next event (or until a submit or
abort wakes it). Simulated seconds pass ``1 / sim_time_scale`` times as fast as wall
seconds, and results are reported in simulated seconds, so the predictor learns the
timing model whatever the scale.

How many tokens an attempt generates is the request's business, not the model's:
``metadata["sim_output_tokens"]`` when the client set it (the simulator's traces do),
else a deterministic fraction (20-100%) of ``max_tokens`` seeded by the request id, so
every attempt of a request generates the same number.

Text is synthetic: token i of a request is a word drawn from a fixed vocabulary by a
hash of (request id, i), so every attempt of a request says the same thing. An attempt
carries its text (into the Completion and the terminal reply) when the request had a
prompt or asked to stream; synthetic traffic without either stays textless (no bytes
spent on words nobody reads). Streaming polls the model's progress
(``SimulatedGpu.generated``) every ``stream_poll_s`` of wall time and hands the new
tokens to the sink; the remainder goes at the attempt's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import zlib
from collections.abc import Callable

from triage.config.models import TriageConfig
from triage.sim.gpu import FinishedSequence, SequenceRejectedError, gpu_from_config
from triage.topics.messages import WorkItem
from triage.workers.backends.base import (
    AttemptResult,
    AttemptStatus,
    Backend,
    EngineLoad,
    TokenSink,
    epoch_ms,
)
from triage.workers.errors import UnknownGpuError

log = logging.getLogger(__name__)

OUTPUT_TOKENS_KEY = "sim_output_tokens"
MIN_FRACTION = 0.2  # the hash-drawn share of max_tokens lies in [MIN_FRACTION, 1]
_WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
    "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can",
    "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
    "no", "GPU", "token", "queue", "cache", "tenant", "quota", "batch", "model", "time",
    "request", "reply", "stream", "latency", "memory", "fair",
)  # fmt: skip


def synthetic_tokens(request_id: str, start: int, stop: int) -> list[str]:
    """Pieces of text of tokens ``start..stop-1`` of a request (see the module docstring)."""
    seed = zlib.crc32(request_id.encode())
    n = len(_WORDS)
    return [" " + _WORDS[(seed + i * 2654435761) % n] for i in range(start, stop)]


def sim_output_tokens(item: WorkItem) -> int:
    """Tokens this request generates in simulation (see the module docstring)."""
    raw = item.metadata.get(OUTPUT_TOKENS_KEY)
    if raw is not None:
        try:
            return max(1, min(item.max_tokens, int(raw)))
        except ValueError:
            log.warning("%s: metadata %s=%r is not an integer; drawing one",
                        item.request_id, OUTPUT_TOKENS_KEY, raw)  # fmt: skip
    digest = hashlib.blake2b(item.request_id.encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2.0**64
    return max(1, round(item.max_tokens * (MIN_FRACTION + (1.0 - MIN_FRACTION) * u)))


class SimBackend(Backend):
    """Runs attempts on a SimulatedGpu in (scaled) real time."""

    kind = "sim"
    simulated = True

    def __init__(
        self,
        *,
        config: TriageConfig,
        gpu_id: str,
        time_scale: float | None = None,
        noise: float = 0.05,
        seed: int | None = None,
        max_num_seqs: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        stream_poll_s: float = 0.05,
    ) -> None:
        if config.pool_of_gpu(gpu_id) is None:
            raise UnknownGpuError(
                f"unknown GPU {gpu_id!r}; configured GPUs: {', '.join(config.all_gpus())}"
            )
        self.time_scale = time_scale if time_scale is not None else config.worker.sim_time_scale
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.gpu = gpu_from_config(
            config,
            gpu_id,
            noise=noise,
            seed=seed if seed is not None else zlib.crc32(gpu_id.encode()),
            max_num_seqs=max_num_seqs,
        )
        self._clock = clock
        self._stream_poll_s = stream_poll_s
        self._t0 = clock()
        self._pending: dict[str, asyncio.Future[FinishedSequence]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._busy_mark = (0.0, 0.0)  # (sim time, busy seconds) at the last load()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._task is None:
            self._closing = False
            self._t0 = self._clock()
            self._task = asyncio.create_task(self._engine_loop(), name=f"sim-{self.gpu.gpu_id}")

    async def close(self) -> None:
        for wid in list(self._pending):
            await self.abort(wid)
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ------------------------------------------------------------------ attempts

    async def run(self, item: WorkItem, sink: TokenSink | None = None) -> AttemptResult:
        if self._task is None:
            await self.start()
        wid = item.work_id
        started_ms = epoch_ms()
        now = self._pump()
        try:
            self.gpu.submit(wid, model=item.model, prompt_tokens=item.prompt_tokens,
                            output_tokens=sim_output_tokens(item), now=now)  # fmt: skip
        except SequenceRejectedError as exc:
            return _failed(str(exc), started_ms)
        fut: asyncio.Future[FinishedSequence] = asyncio.get_running_loop().create_future()
        self._pending[wid] = fut
        self._wake.set()
        streamed = 0
        try:
            if sink is None:
                fs = await fut
            else:
                streamed = await self._stream(item, fut, sink)
                fs = fut.result()
        except asyncio.CancelledError:
            if wid in self.gpu:
                self.gpu.abort(wid, self._sim_now())
            self._pending.pop(wid, None)
            raise
        if sink is not None and fs.output_tokens > streamed:
            sink.tokens(synthetic_tokens(item.request_id, streamed, fs.output_tokens))
        wants_text = sink is not None or item.prompt is not None or item.messages is not None
        first_ms = None
        if fs.first_token_at is not None:  # the model's instant, in wall time
            first_ms = started_ms + round(fs.prefill_s * self.time_scale * 1000.0)
        return AttemptResult(
            status=AttemptStatus.ABORTED if fs.aborted else AttemptStatus.COMPLETED,
            output_tokens=fs.output_tokens,
            prefill_s=fs.prefill_s - fs.queue_s,
            decode_s=fs.decode_s,
            queue_s=fs.queue_s,
            mean_concurrency=fs.mean_concurrency,
            started_at_ms=started_ms,
            finished_at_ms=epoch_ms(),
            text="".join(synthetic_tokens(item.request_id, 0, fs.output_tokens))
            if wants_text else None,
            first_token_at_ms=first_ms,
        )

    async def _stream(
        self, item: WorkItem, fut: asyncio.Future[FinishedSequence], sink: TokenSink
    ) -> int:
        """Hand the sink the tokens the model has generated, every poll, until the attempt
        ends; return how many were handed over."""
        wid, sent = item.work_id, 0
        while not fut.done():
            await asyncio.wait([fut], timeout=self._stream_poll_s)
            if fut.done():
                break
            self._pump()
            n = self.gpu.generated(wid)
            if n > sent:
                sink.tokens(synthetic_tokens(item.request_id, sent, n))
                sent = n
        return sent

    async def abort(self, work_id: str) -> bool:
        now = self._pump()
        fs = self.gpu.abort(work_id, now)
        fut = self._pending.pop(work_id, None)
        if fs is None or fut is None:
            return False
        if not fut.done():
            fut.set_result(fs)
        self._wake.set()
        return True

    def load(self) -> EngineLoad:
        now = self._pump()
        busy = self.gpu.busy_seconds
        t_prev, busy_prev = self._busy_mark
        self._busy_mark = (now, busy)
        util = (busy - busy_prev) / (now - t_prev) if now > t_prev else None
        kv = self.gpu.kv_used_bytes
        return EngineLoad(
            running=self.gpu.running,
            waiting=self.gpu.waiting,
            kv_used_bytes=kv,
            utilization=None if util is None else min(1.0, max(0.0, util)),
            running_seqs=self.gpu.running,
            waiting_seqs=self.gpu.waiting,
            kv_usage=min(1.0, kv / self.gpu.kv_budget_bytes) if self.gpu.kv_budget_bytes else None,
        )

    # ------------------------------------------------------------------ engine loop

    def _sim_now(self) -> float:
        return max(self.gpu.now, (self._clock() - self._t0) / self.time_scale)

    def _pump(self) -> float:
        """Advance the model to now and resolve what finished; return the sim time."""
        now = self._sim_now()
        for fs in self.gpu.advance(now):
            fut = self._pending.pop(str(fs.key), None)
            if fut is not None and not fut.done():
                fut.set_result(fs)
        return now

    async def _engine_loop(self) -> None:
        # asyncio.timeout, not wait_for: 3.11's wait_for drops a cancel that races a wake-up.
        while not self._closing:
            now = self._pump()
            nxt = self.gpu.next_event_time()
            self._wake.clear()
            delay = None if nxt is None else max(0.0, (nxt - now) * self.time_scale)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()


def _failed(error: str, started_ms: int) -> AttemptResult:
    now = epoch_ms()
    return AttemptResult(
        status=AttemptStatus.FAILED,
        output_tokens=0,
        prefill_s=0.0,
        decode_s=0.0,
        mean_concurrency=0.0,
        started_at_ms=started_ms,
        finished_at_ms=now,
        error=error,
    )
