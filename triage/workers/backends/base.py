"""The backend interface: run one attempt of a WorkItem, abort it, report load.

A backend never raises for an execution failure: ``run`` returns a FAILED result with
the error, so the worker always has something to publish. Only cancellation of the
awaiting task propagates (the worker is shutting down).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol

from triage.topics.messages import WorkItem


class AttemptStatus(StrEnum):
    COMPLETED = "completed"
    ABORTED = "aborted"  # stopped by ``abort`` (preempt/cancel/shutdown): partial tokens
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one attempt measured. Durations are in the backend's own seconds: simulated
    seconds for ``sim`` (so the predictor learns the model, not the wall clock)."""

    status: AttemptStatus
    output_tokens: int  # tokens generated (so far, when aborted)
    prefill_s: float  # prefill time: the engine started it to its first token
    decode_s: float  # first token to the end
    mean_concurrency: float  # sequences running beside it on this GPU, on average
    started_at_ms: int  # wall clock, epoch ms
    finished_at_ms: int
    error: str | None = None  # why it failed
    text: str | None = None  # generated text (real backends; sim: synthetic, when asked)
    first_token_at_ms: int | None = None  # wall clock of the first token (None: none came)
    queue_s: float = 0.0  # waited inside the engine before it started (not prefill work)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """A backend's view of its GPU for the heartbeat and metrics."""

    running: int  # sequences holding KV
    waiting: int  # sequences queued inside the engine
    kv_used_bytes: int | None  # None when the backend cannot know (a real server)
    utilization: float | None  # busy fraction since the previous reading; None: unknown
    # The serving engine's own counts where the backend can read them (vLLM's /metrics,
    # the sim's model): reported on the heartbeat as running_seqs / waiting_seqs / kv_usage.
    running_seqs: int | None = None
    waiting_seqs: int | None = None
    kv_usage: float | None = None  # 0..1 of the engine's KV cache


class TokenSink(Protocol):
    """Where a backend puts the text it generates, as it generates it (streaming)."""

    def tokens(self, pieces: Sequence[str]) -> None:
        """The next generated tokens' text, one piece per token, in order."""


class Backend(ABC):
    """Executes WorkItems on one GPU. Many ``run`` calls are in flight at once."""

    kind: ClassVar[str]
    simulated: ClassVar[bool] = False  # True when no real inference happens

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections / start the engine loop. Called once before ``run``."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. In-flight attempts should have ended."""

    @abstractmethod
    async def run(self, item: WorkItem, sink: TokenSink | None = None) -> AttemptResult:
        """Execute one attempt to its end (completed, failed, or aborted). With a ``sink``
        (the request asked to stream), hand it the generated text as it is generated."""

    @abstractmethod
    async def abort(self, work_id: str) -> bool:
        """Stop a running attempt; its ``run`` returns ABORTED. False if not running."""

    @abstractmethod
    def load(self) -> EngineLoad:
        """Current load; utilization covers the time since the previous call."""


def epoch_ms() -> int:
    return int(time.time() * 1000)
