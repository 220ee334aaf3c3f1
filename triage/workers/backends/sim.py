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
    epoch_ms,
)
from triage.workers.errors import UnknownGpuError

log = logging.getLogger(__name__)

OUTPUT_TOKENS_KEY = "sim_output_tokens"
MIN_FRACTION = 0.2  # the hash-drawn share of max_tokens lies in [MIN_FRACTION, 1]


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

    async def run(self, item: WorkItem) -> AttemptResult:
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
        try:
            fs = await fut
        except asyncio.CancelledError:
            if wid in self.gpu:
                self.gpu.abort(wid, self._sim_now())
            self._pending.pop(wid, None)
            raise
        return AttemptResult(
            status=AttemptStatus.ABORTED if fs.aborted else AttemptStatus.COMPLETED,
            output_tokens=fs.output_tokens,
            prefill_s=fs.prefill_s - fs.queue_s,
            decode_s=fs.decode_s,
            queue_s=fs.queue_s,
            mean_concurrency=fs.mean_concurrency,
            started_at_ms=started_ms,
            finished_at_ms=epoch_ms(),
        )

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
        return EngineLoad(
            running=self.gpu.running,
            waiting=self.gpu.waiting,
            kv_used_bytes=self.gpu.kv_used_bytes,
            utilization=None if util is None else min(1.0, max(0.0, util)),
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
