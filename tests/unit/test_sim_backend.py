"""The worker's sim backend: SimulatedGpu in scaled wall time, results in simulated seconds."""

from __future__ import annotations

import asyncio

import pytest

from triage.config import TriageConfig
from triage.topics.messages import WorkItem
from triage.workers.backends.base import AttemptStatus
from triage.workers.backends.sim import SimBackend, sim_output_tokens, synthetic_tokens


def item(rid: str, *, out: int | None = 20, prompt: int = 1000, max_tokens: int = 100) -> WorkItem:
    return WorkItem(
        request_id=rid, tenant="rag", model="llama-3.1-8b", pool="shared", gpu_id="gpu-0",
        prompt_tokens=prompt, max_tokens=max_tokens, reserved_kv_bytes=1, predicted_s=1.0,
        dispatched_at_ms=0, deadline_ms=1, arrived_at_ms=0,
        metadata={} if out is None else {"sim_output_tokens": str(out)},
    )  # fmt: skip


def test_output_tokens_from_metadata_or_a_stable_hash() -> None:
    assert sim_output_tokens(item("a", out=7)) == 7
    assert sim_output_tokens(item("a", out=10_000)) == 100  # clamped to max_tokens
    drawn = [sim_output_tokens(item(f"r{i}", out=None, max_tokens=1000)) for i in range(200)]
    assert drawn == [sim_output_tokens(item(f"r{i}", out=None, max_tokens=1000))
                     for i in range(200)]  # fmt: skip
    assert all(200 <= n <= 1000 for n in drawn)
    assert len(set(drawn)) > 100  # spread, not a constant
    bad = item("x", out=None).model_copy(update={"metadata": {"sim_output_tokens": "many"}})
    assert 20 <= sim_output_tokens(bad) <= 100


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_reports_simulated_seconds(triage_config: TriageConfig) -> None:
    async def go() -> object:
        b = SimBackend(config=triage_config, gpu_id="gpu-0", time_scale=0.001, noise=0.0)
        await b.start()
        try:
            return await b.run(item("one", out=50, prompt=1000))
        finally:
            await b.close()

    r = run(go())
    m = triage_config.model("llama-3.1-8b")
    assert m is not None
    assert r.status is AttemptStatus.COMPLETED and r.output_tokens == 50
    assert r.prefill_s == pytest.approx(1000 * m.prefill_s_per_token, rel=1e-6)
    assert r.decode_s == pytest.approx(50 * m.decode_s_per_token, rel=1e-6)
    assert r.mean_concurrency == 1.0


def test_concurrent_attempts_batch_and_abort_keeps_partial_tokens(
    triage_config: TriageConfig,
) -> None:
    async def go() -> tuple[list[object], object, bool]:
        b = SimBackend(config=triage_config, gpu_id="gpu-0", time_scale=0.01, noise=0.0)
        await b.start()
        long = asyncio.create_task(b.run(item("long", out=100_000, max_tokens=100_000)))
        batch = await asyncio.gather(*(b.run(item(f"r{i}", out=200)) for i in range(5)))
        load = b.load()
        assert load.running == 1 and load.kv_used_bytes and 0.0 <= (load.utilization or 0) <= 1
        ok = await b.abort("long#0")
        partial = await long
        await b.close()
        return list(batch), partial, ok

    batch, partial, ok = run(go())
    assert ok
    assert all(r.status is AttemptStatus.COMPLETED for r in batch)  # type: ignore[attr-defined]
    assert max(r.mean_concurrency for r in batch) > 3.0  # type: ignore[attr-defined]
    assert partial.status is AttemptStatus.ABORTED  # type: ignore[attr-defined]
    assert 0 < partial.output_tokens < 100_000  # type: ignore[attr-defined]


def test_what_never_fits_fails_with_a_reason(triage_config: TriageConfig) -> None:
    async def go() -> object:
        b = SimBackend(config=triage_config, gpu_id="gpu-0", time_scale=0.001)
        try:
            return await b.run(item("huge", prompt=1_000_000, out=1))
        finally:
            await b.close()

    r = run(go())
    assert r.status is AttemptStatus.FAILED and "budget" in (r.error or "")  # type: ignore[attr-defined]


class _Sink:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def tokens(self, pieces: object) -> None:
        self.calls.append(list(pieces))  # type: ignore[call-overload]


def test_streams_synthetic_tokens_as_the_model_generates_them(
    triage_config: TriageConfig,
) -> None:
    """200 tokens at 12 ms each (simulated) take ~0.24 s of wall time at scale 0.1: the
    sink hears of them over several polls, in order, and the text is the request's."""

    async def go() -> object:
        b = SimBackend(config=triage_config, gpu_id="gpu-0", time_scale=0.1, noise=0.0,
                       stream_poll_s=0.01)  # fmt: skip
        await b.start()
        try:
            return await b.run(item("s", out=200, prompt=100, max_tokens=200), sink)
        finally:
            await b.close()

    sink = _Sink()
    r = run(go())
    assert r.status is AttemptStatus.COMPLETED and r.output_tokens == 200  # type: ignore[attr-defined]
    pieces = [p for call in sink.calls for p in call]
    assert pieces == synthetic_tokens("s", 0, 200)
    assert len(sink.calls) >= 3  # streamed, not handed over at the end in one call
    assert r.text == "".join(pieces)  # type: ignore[attr-defined]
    assert r.first_token_at_ms is not None  # type: ignore[attr-defined]


def test_text_only_when_asked_for(triage_config: TriageConfig) -> None:
    async def go(work: WorkItem) -> object:
        b = SimBackend(config=triage_config, gpu_id="gpu-0", time_scale=0.001, noise=0.0)
        await b.start()
        try:
            return await b.run(work)
        finally:
            await b.close()

    bare = run(go(item("t", out=5)))
    assert bare.text is None  # type: ignore[attr-defined]
    prompted = run(go(item("t", out=5).model_copy(update={"prompt": "hello"})))
    assert prompted.text == "".join(synthetic_tokens("t", 0, 5))  # type: ignore[attr-defined]
    assert synthetic_tokens("t", 2, 5) == synthetic_tokens("t", 0, 5)[2:]
    assert synthetic_tokens("t", 0, 5) != synthetic_tokens("u", 0, 5)
