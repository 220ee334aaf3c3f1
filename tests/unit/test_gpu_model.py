"""The continuous-batching GPU timing model (triage.sim.gpu)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.config.models import ModelConfig
from triage.sim.gpu import FinishedSequence, SequenceRejectedError, SimulatedGpu

SMALL = ModelConfig(
    name="small",
    pool="p",
    layers=2,
    kv_heads=1,
    head_dim=8,
    dtype="fp16",  # 2 x 2 x 1 x 8 x 2 = 64 bytes per token
    prefill_s_per_token=0.001,
    decode_s_per_token=0.01,
    batch_slowdown=0.1,
)
BIG = ModelConfig(
    name="big",
    pool="p",
    layers=4,
    kv_heads=1,
    head_dim=8,
    dtype="fp16",  # 128 bytes per token
    prefill_s_per_token=0.004,
    decode_s_per_token=0.05,
    batch_slowdown=0.05,
)
BPT = SMALL.kv_bytes_per_token


def make_gpu(
    budget_tokens: int = 100_000,
    *,
    speed: float = 1.0,
    noise: float = 0.0,
    seed: int = 0,
    **kw: int,
) -> SimulatedGpu:
    return SimulatedGpu(
        gpu_id="g0",
        gpu_type="test",
        speed=speed,
        kv_budget_bytes=budget_tokens * BPT,
        models={"small": SMALL, "big": BIG},
        noise=noise,
        seed=seed,
        **kw,
    )


def drain(gpu: SimulatedGpu, check=None) -> list[FinishedSequence]:  # type: ignore[no-untyped-def]
    """Advance event by event until idle, checking invariants after each event."""
    out: list[FinishedSequence] = []
    while (t := gpu.next_event_time()) is not None:
        out += gpu.advance(t)
        assert gpu.kv_used_bytes <= gpu.kv_budget_bytes
        if check:
            check(gpu)
    return out


def test_single_sequence_time_is_prefill_plus_output_steps() -> None:
    gpu = make_gpu(speed=2.0)
    gpu.submit("a", model="small", prompt_tokens=500, output_tokens=40, now=1.0)
    assert gpu.running == 1 and gpu.waiting == 0
    [done] = drain(gpu)
    prefill = 500 * 0.001 / 2.0
    step = 0.01 / 2.0
    assert done.first_token_at == pytest.approx(1.0 + prefill, rel=1e-12)
    assert done.finished_at == pytest.approx(1.0 + prefill + 40 * step, rel=1e-12)
    assert done.prefill_s == pytest.approx(prefill, rel=1e-12)
    assert done.decode_s == pytest.approx(40 * step, rel=1e-12)
    assert done.output_tokens == 40 and not done.aborted
    assert done.mean_concurrency == 1.0
    assert gpu.busy_seconds == pytest.approx(prefill + 40 * step, rel=1e-12)
    assert gpu.running == 0 and gpu.kv_used_bytes == 0


@pytest.mark.parametrize("n", [2, 5, 20])
def test_decode_slows_with_concurrency_as_configured(n: int) -> None:
    gpu = make_gpu()
    for i in range(n):
        gpu.submit(i, model="small", prompt_tokens=10, output_tokens=100, now=0.0)
    done = drain(gpu)
    assert len(done) == n
    stall = n * 10 * 0.001  # every prefill stalls the batch, including the later ones
    step = 0.01 * (1 + 0.1 * (n - 1))
    for d in done:
        assert d.mean_concurrency == pytest.approx(n)
        assert d.finished_at == pytest.approx(stall + 100 * step, rel=1e-9)
    # The first sequence's decode includes the stalls of the n-1 prefills after it.
    first = min(done, key=lambda d: d.first_token_at or 0)
    assert first.decode_s == pytest.approx(100 * step + (n - 1) * 0.01, rel=1e-9)


def test_two_models_time_slice_their_steps() -> None:
    gpu = make_gpu()
    gpu.submit("s", model="small", prompt_tokens=1, output_tokens=1000, now=0.0)
    gpu.submit("b", model="big", prompt_tokens=1, output_tokens=10, now=0.0)
    assert gpu.advance(0.5) == []
    [b] = gpu.advance(1.0)
    assert b.key == "b"
    # While both run, a step is one step of each engine: 0.01 + 0.05.
    assert b.decode_s == pytest.approx(10 * (0.01 + 0.05), rel=1e-9)
    [s] = drain(gpu)  # then the small model runs alone at its own step time
    assert s.finished_at == pytest.approx(b.finished_at + 990 * 0.01, rel=1e-9)


def test_kv_grows_per_step_and_is_released() -> None:
    gpu = make_gpu()
    gpu.submit("a", model="small", prompt_tokens=100, output_tokens=50, now=0.0)
    assert gpu.kv_used_bytes == 100 * BPT  # held from the start of the prefill
    gpu.advance(0.1 + 20 * 0.01)  # prefill, then 20 steps
    assert gpu.kv_used_bytes == pytest.approx(120 * BPT, abs=1)
    drain(gpu)
    assert gpu.kv_used_bytes == 0


def test_fifo_head_of_line_and_memory_gate() -> None:
    gpu = make_gpu(budget_tokens=1000)
    gpu.submit("a", model="small", prompt_tokens=600, output_tokens=100, now=0.0)
    gpu.submit("big", model="small", prompt_tokens=500, output_tokens=10, now=0.0)
    gpu.submit("small", model="small", prompt_tokens=10, output_tokens=10, now=0.0)
    assert gpu.running == 1 and gpu.waiting == 2  # "small" fits but waits behind "big"
    done = drain(gpu)
    assert [d.key for d in done] == ["a", "big", "small"]
    assert all(d.engine_preemptions == 0 for d in done)


def test_max_num_seqs_bounds_the_batch() -> None:
    gpu = make_gpu(max_num_seqs=3)
    for i in range(7):
        gpu.submit(i, model="small", prompt_tokens=5, output_tokens=20, now=0.0)
    assert gpu.running == 3 and gpu.waiting == 4
    done = drain(gpu, check=lambda g: g.running <= 3)
    assert len(done) == 7
    assert max(d.mean_concurrency for d in done) <= 3 + 1e-9


def test_overflow_preempts_newest_and_recomputes_when_peak_not_reserved() -> None:
    gpu = make_gpu(budget_tokens=1000)
    for i in range(5):  # each peaks at 400 tokens; together 2000 > 1000
        gpu.submit(i, model="small", prompt_tokens=100, output_tokens=300, now=0.0)
    assert gpu.running == 5  # admission by current KV only: 500 tokens fit
    done = drain(gpu)
    assert sorted(d.key for d in done) == [0, 1, 2, 3, 4]
    assert all(d.output_tokens == 300 for d in done)
    assert gpu.engine_preemptions >= 1
    assert gpu.recomputed_tokens == sum(d.recomputed_tokens for d in done) > 0
    victims = [d for d in done if d.engine_preemptions]
    assert victims and all(d.recomputed_tokens >= 100 for d in victims)
    assert 0 not in {d.key for d in victims}  # the oldest is never the one evicted


def test_no_overflow_when_admission_reserves_peak() -> None:
    gpu = make_gpu(budget_tokens=1000)
    for i in range(5):  # peaks sum to 5 x 200 = 1000: exactly the budget
        gpu.submit(i, model="small", prompt_tokens=50, output_tokens=150, now=0.0)
    done = drain(gpu)
    assert len(done) == 5
    assert gpu.engine_preemptions == 0 and gpu.recomputed_tokens == 0


def test_abort_returns_partial_progress() -> None:
    gpu = make_gpu()
    gpu.submit("a", model="small", prompt_tokens=100, output_tokens=100, now=0.0)
    gpu.submit("w", model="small", prompt_tokens=100, output_tokens=100, now=0.0)
    part = gpu.abort("a", 0.2 + 30.5 * 0.011)  # both prefills (0.2 s), then 30.5 steps of two
    assert part is not None and part.aborted
    assert part.output_tokens == 30
    assert part.first_token_at == pytest.approx(0.1)
    assert "a" not in gpu and gpu.abort("a", 1.0) is None
    [w] = drain(gpu)
    assert w.key == "w" and w.output_tokens == 100 and not w.aborted
    assert gpu.abort("w", w.finished_at + 1) is None  # finished: nothing to abort


def test_abort_before_start_and_during_prefill() -> None:
    gpu = make_gpu(budget_tokens=300)
    gpu.submit("a", model="small", prompt_tokens=200, output_tokens=50, now=0.0)
    gpu.submit("b", model="small", prompt_tokens=200, output_tokens=50, now=0.0)
    queued = gpu.abort("b", 0.05)
    assert queued is not None and queued.started_at is None and queued.output_tokens == 0
    prefilling = gpu.abort("a", 0.1)  # its prefill ends at 0.2
    assert prefilling is not None and prefilling.first_token_at is None
    assert prefilling.started_at == 0.0 and prefilling.output_tokens == 0
    assert gpu.running == 0 and gpu.waiting == 0 and gpu.next_event_time() is None
    assert drain(gpu) == []


def test_submit_rejects_what_can_never_run() -> None:
    gpu = make_gpu(budget_tokens=1000)
    with pytest.raises(SequenceRejectedError, match="not served"):
        gpu.submit("x", model="nope", prompt_tokens=1, output_tokens=1, now=0.0)
    with pytest.raises(SequenceRejectedError, match="budget"):
        gpu.submit("x", model="small", prompt_tokens=900, output_tokens=101, now=0.0)
    gpu.submit("x", model="small", prompt_tokens=10, output_tokens=1, now=0.0)
    with pytest.raises(SequenceRejectedError, match="already"):
        gpu.submit("x", model="small", prompt_tokens=10, output_tokens=1, now=0.0)
    with pytest.raises(ValueError, match="backwards"):
        gpu.advance(-1.0)


def _workload(gpu: SimulatedGpu, splits: int = 1) -> list[FinishedSequence]:
    out: list[FinishedSequence] = []
    t = 0.0
    for i in range(60):
        t += 0.05 + (i % 7) * 0.01
        for k in range(1, splits + 1):  # extra advance calls between submits
            out += gpu.advance(t - 0.05 + 0.05 * k / splits)
        gpu.submit(i, model="small" if i % 3 else "big", prompt_tokens=50 + 13 * (i % 11),
                   output_tokens=20 + 17 * (i % 13), now=t)  # fmt: skip
    return out + drain(gpu)


def test_deterministic_per_seed() -> None:
    a = _workload(make_gpu(budget_tokens=3000, noise=0.2, seed=7))
    b = _workload(make_gpu(budget_tokens=3000, noise=0.2, seed=7))
    c = _workload(make_gpu(budget_tokens=3000, noise=0.2, seed=8))
    assert a == b
    assert [d.finished_at for d in a] != [d.finished_at for d in c]


def test_splitting_advance_calls_changes_nothing() -> None:
    a = _workload(make_gpu(budget_tokens=3000, noise=0.2, seed=3), splits=1)
    b = _workload(make_gpu(budget_tokens=3000, noise=0.2, seed=3), splits=4)
    assert [(d.key, d.output_tokens) for d in a] == [(d.key, d.output_tokens) for d in b]
    for x, y in zip(a, b, strict=True):
        assert x.finished_at == pytest.approx(y.finished_at, rel=1e-9)


def test_noise_is_mean_one_and_makes_error_to_learn() -> None:
    exact = 100 * 0.001 + 50 * 0.01
    times = []
    for seed in range(300):
        gpu = make_gpu(noise=0.2, seed=seed)
        gpu.submit("a", model="small", prompt_tokens=100, output_tokens=50, now=0.0)
        [d] = drain(gpu)
        times.append(d.finished_at)
    mean = sum(times) / len(times)
    assert 0.95 < mean / exact < 1.05
    assert max(times) / min(times) > 1.3  # real spread, not a constant


def test_busy_seconds_skip_idle_gaps() -> None:
    gpu = make_gpu()
    gpu.submit("a", model="small", prompt_tokens=100, output_tokens=10, now=0.0)
    drain(gpu)
    gpu.advance(10.0)
    gpu.submit("b", model="small", prompt_tokens=100, output_tokens=10, now=10.0)
    drain(gpu)
    assert gpu.busy_seconds == pytest.approx(2 * (0.1 + 0.1))
    assert gpu.now == pytest.approx(10.2)


# ------------------------------------------------------------------ properties

op = st.one_of(
    st.tuples(
        st.just("submit"),
        st.floats(0.0, 0.5),  # time step
        st.sampled_from(["small", "big"]),
        st.integers(1, 400),  # prompt
        st.integers(0, 300),  # output
    ),
    st.tuples(st.just("advance"), st.floats(0.0, 2.0)),
    st.tuples(st.just("abort"), st.floats(0.0, 0.5), st.integers(0, 40)),
)


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(op, max_size=60),
    budget=st.integers(800, 5000),
    max_seqs=st.integers(1, 8),
    noise=st.sampled_from([0.0, 0.3]),
)
def test_random_operations_conserve_and_stay_in_budget(
    ops: list[tuple], budget: int, max_seqs: int, noise: float
) -> None:
    gpu = make_gpu(budget_tokens=budget, noise=noise, max_num_seqs=max_seqs)
    submitted: dict[int, int] = {}  # key -> output tokens
    ended: dict[int, FinishedSequence] = {}
    t = 0.0
    last_finish = 0.0

    def collect(results: list[FinishedSequence]) -> None:
        nonlocal last_finish
        for d in results:
            assert d.key not in ended, "a sequence ended twice"
            assert d.finished_at >= last_finish - 1e-12, "advance went back in time"
            assert d.finished_at <= gpu.now + 1e-12
            assert d.output_tokens == submitted[d.key] and not d.aborted
            last_finish = d.finished_at
            ended[d.key] = d

    for o in ops:
        if o[0] == "submit":
            t += o[1]
            key = len(submitted)
            out_tokens = o[4]
            bpt = SMALL.kv_bytes_per_token if o[2] == "small" else BIG.kv_bytes_per_token
            if (o[3] + out_tokens) * bpt > budget * BPT:
                with pytest.raises(SequenceRejectedError):
                    gpu.submit(key, model=o[2], prompt_tokens=o[3], output_tokens=out_tokens, now=t)
                continue
            submitted[key] = out_tokens
            gpu.submit(key, model=o[2], prompt_tokens=o[3], output_tokens=out_tokens, now=t)
        elif o[0] == "advance":
            t += o[1]
            collect(gpu.advance(t))
        else:
            t += o[1]
            res = gpu.abort(o[2], t)
            if res is not None:
                assert o[2] in submitted and o[2] not in ended
                assert res.aborted and 0 <= res.output_tokens <= submitted[o[2]]
                assert res.finished_at == t
                ended[o[2]] = res
        assert gpu.now == t
        collect(gpu.advance(t))  # results of events inside submit/abort wait for an advance
        assert gpu.kv_used_bytes <= gpu.kv_budget_bytes
        assert gpu.running <= max_seqs
        assert gpu.running + gpu.waiting == len(submitted) - len(ended)
        nxt = gpu.next_event_time()
        assert nxt is None or nxt >= t - 1e-9
    while (nt := gpu.next_event_time()) is not None:
        collect(gpu.advance(nt))
        assert gpu.kv_used_bytes <= gpu.kv_budget_bytes
    # Conservation: every submitted sequence ended exactly once.
    assert set(ended) == set(submitted)
    assert gpu.running == 0 and gpu.waiting == 0 and gpu.kv_used_bytes == 0
    assert gpu.busy_seconds <= gpu.now + 1e-9
