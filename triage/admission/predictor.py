"""Check 5, workload prediction: execution time fitted online from completions.

Per model and GPU type: prefill seconds per prompt token (a line through the
origin), and decode seconds per output token as a line in the number of
concurrent sequences (continuous batching slows decode). Per tenant: the ratio
of used to requested output tokens. Per model: the variance buffer, the empirical
quantile of actual/predicted time at 1 - target miss rate, capped.

The buffer measures the predictor as it is now: each completion is compared with
what the *current* fit (before it learns from that completion) predicts for the
request's inputs at dispatch, not with the stale prediction made back then. A cold
fit that was 5x off and has since converged therefore stops inflating the buffer
at once; otherwise the buffer stays inflated, refuses everything as infeasible,
gets no completions to learn from, and never recovers.

All fits are exponentially decayed sums, seeded with the configured priors as
pseudo-observations, so predictions are sane before the first completion.
"""

from __future__ import annotations

import math
from typing import Final

PRIOR_WEIGHT: Final = 20.0  # pseudo-observations behind each prior
# decode observations weigh their output tokens; a prior counts this
DECODE_REF_TOKENS: Final = 100.0
_SUMS = ("pxx", "pxy", "dw", "dn", "dnn", "dy", "dny")  # a CostModel's learned state


class CostModel:
    """Time model of one model on one GPU type."""

    __slots__ = (
        "_b0",
        "_b1",
        "_idle_b0",
        "_idle_prefill",
        "_prefill",
        "decay",
        "dn",
        "dnn",
        "dny",
        "dw",
        "dy",
        "observations",
        "pxx",
        "pxy",
    )

    def __init__(
        self, *, prefill_s_per_token: float, decode_s_per_token: float,
        batch_slowdown: float, half_life: int,
    ) -> None:
        self.decay: float = 0.5 ** (1.0 / half_life)  # typed: `**` is Any (boxed math)
        # prefill: y = a * x through the origin; sums at a 1,000-token reference prompt
        ref = 1000.0
        self.pxx = PRIOR_WEIGHT * ref * ref
        self.pxy = PRIOR_WEIGHT * ref * ref * prefill_s_per_token
        # decode per token: y = b0 + b1 * (n - 1), least squares weighted by output tokens
        # (a 1-token completion's time is mostly prefill stalls of its neighbours, a
        # 300-token one's is its decode rate); priors at n = 1 and n = 17
        b0 = decode_s_per_token
        b1 = decode_s_per_token * batch_slowdown
        w = PRIOR_WEIGHT * DECODE_REF_TOKENS / 2.0
        self.dw = 2 * w
        self.dn = w * 16.0
        self.dnn = w * 256.0
        self.dy = w * b0 + w * (b0 + 16.0 * b1)
        self.dny = w * 16.0 * (b0 + 16.0 * b1)
        self.observations = 0
        # the configured model of a lone sequence on an idle GPU: learned figures under
        # load carry the stalls of other sequences' prefills, which an idle GPU has not
        self._idle_prefill = prefill_s_per_token
        self._idle_b0 = decode_s_per_token
        self._refit()

    def predict_idle(self, prompt_tokens: float, output_tokens: float) -> float:
        """Time alone on an idle GPU: the lower of the learned and the configured figures
        (what `sla_infeasible` is judged on: infeasible on an idle GPU, not under load)."""
        a = self._prefill if self._prefill < self._idle_prefill else self._idle_prefill
        b = self._b0 if self._b0 < self._idle_b0 else self._idle_b0
        return prompt_tokens * a + output_tokens * b

    def _refit(self) -> None:
        """Solve the fits once per observation, not once per prediction."""
        self._prefill = self.pxy / self.pxx
        self._b0, self._b1 = self.decode_coefficients()

    @property
    def prefill_s_per_token(self) -> float:
        return self.pxy / self.pxx

    def decode_coefficients(self) -> tuple[float, float]:
        """(seconds per token alone, extra seconds per token per additional sequence)."""
        det = self.dw * self.dnn - self.dn * self.dn
        if det <= 1e-12:
            return self.dy / self.dw, 0.0
        b1 = (self.dw * self.dny - self.dn * self.dy) / det
        b0 = (self.dy - b1 * self.dn) / self.dw
        if b1 < 0.0:  # more company never makes decode faster: refit flat
            return self.dy / self.dw, 0.0
        return max(b0, 1e-9), b1

    def decode_step(self, concurrency: float) -> float:
        """Predicted decode seconds per token with `concurrency` sequences running."""
        n1 = concurrency - 1.0 if concurrency > 1.0 else 0.0
        return self._b0 + self._b1 * n1

    def predict(self, prompt_tokens: float, output_tokens: float, concurrency: float) -> float:
        n1 = concurrency - 1.0 if concurrency > 1.0 else 0.0
        return prompt_tokens * self._prefill + output_tokens * (self._b0 + self._b1 * n1)

    def observe(
        self, *, prompt_tokens: int, prefill_s: float, output_tokens: int,
        decode_s: float, concurrency: float,
    ) -> None:
        d = self.decay
        if prompt_tokens > 0 and prefill_s >= 0.0:
            x = float(prompt_tokens)
            self.pxx = self.pxx * d + x * x
            self.pxy = self.pxy * d + x * prefill_s
        if output_tokens > 0 and decode_s >= 0.0:
            y = decode_s / output_tokens
            n = (concurrency - 1.0) if concurrency > 1.0 else 0.0
            w = float(output_tokens)
            self.dw = self.dw * d + w
            self.dn = self.dn * d + w * n
            self.dnn = self.dnn * d + w * n * n
            self.dy = self.dy * d + w * y
            self.dny = self.dny * d + w * n * y
        self.observations += 1
        self._refit()

    def snapshot(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in (*_SUMS, "observations")}

    def restore(self, state: dict[str, float]) -> None:
        for k in _SUMS:
            setattr(self, k, float(state[k]))
        self.observations = int(state.get("observations", 0))
        self._refit()


class OutputRatio:
    """A tenant's learned ratio of generated to requested output tokens (not a fixed 0.7)."""

    __slots__ = ("decay", "total", "value", "weight")

    def __init__(self, *, prior: float, half_life: int) -> None:
        self.decay: float = 0.5 ** (1.0 / half_life)  # typed: `**` is Any (boxed math)
        self.weight = PRIOR_WEIGHT / 4.0
        self.total = prior * self.weight
        self.value = prior  # total / weight, kept current on each observation

    @property
    def learned(self) -> bool:
        """Have a few completions outweighed the prior?"""
        return self.weight >= PRIOR_WEIGHT / 2.0

    def observe(self, output_tokens: int, max_tokens: int) -> None:
        if max_tokens <= 0:
            return
        r = output_tokens / max_tokens
        r = 1.0 if r > 1.0 else r
        self.total = self.total * self.decay + r
        self.weight = self.weight * self.decay + 1.0
        self.value = self.total / self.weight


def _bisect(a: list[float], x: float, right: bool) -> int:
    """bisect.bisect_left (right=False) / bisect_right (True) on sorted floats: the same
    index, but compiled it compares unboxed doubles instead of calling float's rich
    compare ~9 times per lookup (the buffer does two lookups per completion)."""
    lo = 0
    hi = len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        v = a[mid]
        if v < x or (right and v == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


class VarianceBuffer:
    """The factor the core multiplies predictions by: the (1 - target miss rate) quantile
    of actual/predicted over a sliding window; `initial` until enough samples."""

    __slots__ = (
        "_i", "_ring", "_sorted", "cap", "initial", "min_samples", "q", "value", "window",
    )

    def __init__(
        self, *, initial: float, target_miss_rate: float, window: int, min_samples: int,
        adaptive: bool = True, cap: float = 10.0,
    ) -> None:
        self.initial = initial
        self.cap = cap if cap > initial else initial
        self.value = initial
        self.q = 1.0 - target_miss_rate
        self.window = window
        self.min_samples = min(min_samples, window) if adaptive else window + 1
        self._ring: list[float] = []
        self._sorted: list[float] = []
        self._i = 0

    def observe(self, actual_s: float, predicted_s: float) -> None:
        if predicted_s <= 0.0 or not math.isfinite(actual_s) or actual_s < 0.0:
            return
        r = actual_s / predicted_s
        if len(self._ring) < self.window:
            self._ring.append(r)
        else:
            old = self._ring[self._i]
            self._ring[self._i] = r
            self._i = (self._i + 1) % self.window
            # remove one copy of old from the sorted list (bisect keeps this O(log n) + shift)
            del self._sorted[_bisect(self._sorted, old, False)]
        self._sorted.insert(_bisect(self._sorted, r, True), r)
        n = len(self._sorted)
        if n >= self.min_samples:
            k = min(n - 1, math.ceil(self.q * n) - 1)
            v = self._sorted[max(0, k)]
            self.value = 1.0 if v < 1.0 else (self.cap if v > self.cap else v)

    def median(self) -> float:
        """The median of actual/predicted (1.0 until min_samples)."""
        n = len(self._sorted)
        return self._sorted[n // 2] if n >= self.min_samples and n > 0 else 1.0

    @property
    def samples(self) -> int:
        return len(self._ring)

    def relative_errors(self) -> list[float]:
        return list(self._ring)


class WorkloadPredictor:
    """Every learned quantity the core predicts with, created lazily from the priors."""

    __slots__ = (
        "_buffer_args",
        "_costs",
        "_ratios",
        "_tenant_priors",
        "buffers",
        "fixed_buffer",
        "gpu_speed",
        "half_life",
        "model_priors",
    )

    def __init__(
        self,
        *,
        model_priors: dict[str, tuple[float, float, float]],
        gpu_speed: dict[str, float],
        tenant_priors: dict[str, float],
        initial_buffer: float = 1.3,
        adaptive_buffer: bool = True,
        target_miss_rate: float = 0.05,
        residual_window: int = 512,
        min_samples: int = 50,
        half_life: int = 500,
        fixed_buffer: float | None = None,
        max_buffer: float = 1.3,
    ) -> None:
        self.model_priors = model_priors  # model -> (prefill s/token, decode s/token, slowdown)
        self.gpu_speed = gpu_speed  # gpu type -> speed relative to the priors
        self._tenant_priors = tenant_priors
        self.half_life = half_life
        self.fixed_buffer = fixed_buffer
        self._buffer_args = (
            initial_buffer if fixed_buffer is None else fixed_buffer, target_miss_rate,
            residual_window, min_samples, adaptive_buffer and fixed_buffer is None, max_buffer,
        )
        self.buffers: dict[str, VarianceBuffer] = {}  # per model: errors differ by model
        self._costs: dict[tuple[str, str], CostModel] = {}
        self._ratios: dict[str, OutputRatio] = {}

    def cost_model(self, model: str, gpu_type: str) -> CostModel:
        key = (model, gpu_type)
        cm = self._costs.get(key)
        if cm is None:
            prefill, decode, slowdown = self.model_priors[model]
            speed = self.gpu_speed.get(gpu_type, 1.0)
            cm = CostModel(
                prefill_s_per_token=prefill / speed,
                decode_s_per_token=decode / speed,
                batch_slowdown=slowdown,
                half_life=self.half_life,
            )
            self._costs[key] = cm
        return cm

    def ratio(self, tenant: str) -> OutputRatio:
        r = self._ratios.get(tenant)
        if r is None:  # first sight of the tenant
            r = OutputRatio(prior=self._tenant_priors.get(tenant, 0.7), half_life=self.half_life)
            self._ratios[tenant] = r
        return r

    def buffer(self, model: str) -> VarianceBuffer:
        b = self.buffers.get(model)
        if b is None:
            initial, miss, window, min_samples, adaptive, cap = self._buffer_args
            b = VarianceBuffer(
                initial=initial, target_miss_rate=miss, window=window,
                min_samples=min_samples, adaptive=adaptive, cap=cap,
            )
            self.buffers[model] = b
        return b

    @property
    def initial_buffer(self) -> float:
        return self._buffer_args[0]

    def buffer_value(self, model: str) -> float:
        b = self.buffers.get(model)
        return self._buffer_args[0] if b is None else b.value

    def median_ratio(self, model: str) -> float:
        """The median of `model`'s actual/predicted time (1.0 before any completion)."""
        b = self.buffers.get(model)
        return 1.0 if b is None else b.median()

    @property
    def variance_buffer(self) -> float:
        """The largest per-model buffer (the initial one before any completion)."""
        return max((b.value for b in self.buffers.values()), default=self._buffer_args[0])

    def observe(
        self, *, tenant: str, model: str, gpu_type: str, prompt_tokens: int, output_tokens: int,
        max_tokens: int, prefill_s: float, decode_s: float, concurrency: float,
        expected_out: float, dispatch_concurrency: float,
    ) -> float:
        """Learn from a completion; returns the relative error actual/predicted (0 if none),
        against what the current fit predicts for the inputs known at dispatch."""
        cm = self.cost_model(model, gpu_type)
        predicted = cm.predict(prompt_tokens, expected_out, dispatch_concurrency)
        cm.observe(
            prompt_tokens=prompt_tokens, prefill_s=prefill_s, output_tokens=output_tokens,
            decode_s=decode_s, concurrency=concurrency,
        )
        self.ratio(tenant).observe(output_tokens, max_tokens)
        actual = prefill_s + decode_s
        if predicted > 0.0:
            self.buffer(model).observe(actual, predicted)
            return actual / predicted
        return 0.0

    def observe_cut(
        self, *, model: str, gpu_type: str, prompt_tokens: int, max_tokens: int,
        elapsed_s: float, expected_out: float, dispatch_concurrency: float,
        concurrency: float,
    ) -> int:
        """Learn from a request stopped past its deadline (`cancel_late`): it ran
        `elapsed_s` and was not done, a lower bound of its service time, which the
        variance buffer takes like a completion's (the stopped requests are the slow
        ones; leaving them out would teach the buffer by the fast ones only). The
        output ratio learns nothing: how much it generated is a guess from the decode
        step, and learning that guess pushed `tenants13@120` at seed 101 from 82% to
        79% of requests met (docs/experiments.md, "Stopping late work"). Returns that
        guess at the running concurrency, for the quota's settlement only."""
        cm = self.cost_model(model, gpu_type)
        predicted = cm.predict(prompt_tokens, expected_out, dispatch_concurrency)
        if predicted > 0.0:
            self.buffer(model).observe(elapsed_s, predicted)
        decoding = elapsed_s - prompt_tokens * cm.prefill_s_per_token
        step = cm.decode_step(concurrency)
        made = int(decoding / step) if decoding > 0.0 and step > 0.0 else 0
        return made if made < max_tokens else max_tokens

    def snapshot(self) -> dict[str, object]:
        return {
            "costs": {f"{m}|{g}": cm.snapshot() for (m, g), cm in self._costs.items()},
            "ratios": {t: [r.total, r.weight] for t, r in self._ratios.items()},
            "residuals": {m: b.relative_errors() for m, b in self.buffers.items()},
        }

    def restore(self, state: dict[str, object]) -> None:
        costs = state.get("costs", {})
        assert isinstance(costs, dict)
        for key, snap in costs.items():
            m, g = str(key).split("|", 1)
            if m in self.model_priors:
                self.cost_model(m, g).restore(snap)
        ratios = state.get("ratios", {})
        assert isinstance(ratios, dict)
        for t, (total, weight) in ratios.items():
            r = self.ratio(t)
            r.total, r.weight = float(total), float(weight)
            r.value = r.total / r.weight
        residuals = state.get("residuals", {})
        if isinstance(residuals, dict):  # older snapshots kept one global list: dropped
            for m, xs in residuals.items():
                if m in self.model_priors:
                    b = self.buffer(str(m))
                    for x in xs:
                        b.observe(float(x), 1.0)
