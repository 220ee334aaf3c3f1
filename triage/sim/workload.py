"""Workloads: per-tenant request streams (arrival process x token distributions).

A request carries what admission sees (prompt tokens, max_tokens, its model and
tenant) and what only the GPU learns (the output tokens it will really generate,
at most max_tokens), so the simulator can reward a predictor that learns each
tenant's used/requested ratio. Streams are generators merged lazily by time:
memory holds one pending arrival per stream, whatever the length of the run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from triage.admission.heaps import heapify, heappop, heapreplace
from triage.admission.record import Record
from triage.config.models import TriageConfig
from triage.sim.arrivals import ArrivalProcess, parse_arrivals, reduce_fields
from triage.sim.dists import TokenDist, parse_dist
from triage.sim.errors import ScenarioError

_ARRIVAL_FIELDS = (
    "t", "tenant", "model", "prompt_tokens", "max_tokens", "output_tokens", "sla_s",
    "request_id",
)


class Arrival(Record):
    """One request as the simulator replays it (an immutable value record)."""

    __slots__ = _ARRIVAL_FIELDS
    _fields: ClassVar[tuple[str, ...]] = _ARRIVAL_FIELDS

    def __init__(
        self, t: float, tenant: str, model: str, prompt_tokens: int, max_tokens: int,
        output_tokens: int, sla_s: float | None = None, request_id: str | None = None,
    ) -> None:
        self.t: Final = t  # arrival time, seconds from the start of the run
        self.tenant: Final = tenant
        self.model: Final = model
        self.prompt_tokens: Final = prompt_tokens  # >= 1
        self.max_tokens: Final = max_tokens  # >= 1: what admission reserves KV for
        self.output_tokens: Final = output_tokens  # 1..max_tokens: what the GPU will generate
        self.sla_s: Final = sla_s  # per-request SLA (None: the tenant's)
        # a recorded id to keep (replay); None: numbered r1, r2..
        self.request_id: Final = request_id


def shape(
    prompt: int, max_tokens: int, output: int, context: int, derived: bool
) -> tuple[int, int, int]:
    """A request as a client would send it: counts >= 1, output <= max_tokens.

    Nothing is clamped to the context: a request whose prompt + max_tokens exceeds it
    is what the live app refuses as `context_overflow`, and `overflows` says so. Only
    a max_tokens the simulator derived (output x factor: traces record what was
    generated, not asked) is fitted into the context, never below the output itself,
    since a real client asks within the context."""
    prompt = prompt if prompt > 1 else 1
    output = output if output > 1 else 1
    if derived:
        room = context - prompt
        max_tokens = max_tokens if max_tokens < room else room
        max_tokens = max_tokens if max_tokens > output else output
    else:
        max_tokens = max_tokens if max_tokens > 1 else 1
        output = output if output < max_tokens else max_tokens
    return prompt, max_tokens, output


def overflows(a: Arrival, context: int) -> bool:
    """The live app's `context_overflow` check: prompt + max_tokens beyond the context."""
    return a.prompt_tokens + a.max_tokens > context


@dataclass(frozen=True, slots=True)
class Workload:
    """One stream of one tenant on one model."""

    tenant: str
    model: str
    arrivals: ArrivalProcess
    prompt: TokenDist
    output: TokenDist  # tokens the request really generates (before the max_tokens cap)
    max_tokens: TokenDist | None = None  # what the client asks for; None: derived from output
    max_factor: float = 1.5  # when derived: ceil(output x factor) ...
    max_cap: int = 4096  # ... capped here
    sla_s: float | None = None

    def stream(self, rng: random.Random, end: float, context: int) -> Iterator[Arrival]:
        prompt_d, out_d, max_d = self.prompt, self.output, self.max_tokens
        factor, cap = self.max_factor, self.max_cap
        tenant, model, sla = self.tenant, self.model, self.sla_s
        for t in self.arrivals.times(rng, end):
            prompt = prompt_d.sample(rng)
            out = out_d.sample(rng)
            if max_d is not None:
                p, m, o = shape(prompt, max_d.sample(rng), out, context, False)
            else:
                p, m, o = shape(prompt, min(cap, math.ceil(out * factor)), out, context, True)
            yield Arrival(t, tenant, model, p, m, o, sla)

    def expected_requests(self, end: float) -> float:
        return self.arrivals.mean_rate(end) * end

    def scaled(self, k: float, rate: float = 1.0) -> Workload:
        """Time axis x k, arrival rates x rate (see ArrivalProcess.scaled)."""
        return Workload(
            tenant=self.tenant, model=self.model, arrivals=self.arrivals.scaled(k, rate),
            prompt=self.prompt, output=self.output, max_tokens=self.max_tokens,
            max_factor=self.max_factor, max_cap=self.max_cap, sla_s=self.sla_s,
        )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_fields(self)


_WORKLOAD_KEYS = {
    "tenant", "model", "arrivals", "prompt", "output", "max_tokens", "max_factor", "max_cap",
    "sla_ms",
}


def parse_workload(
    spec: Any, where: str, config: TriageConfig, *, base: Path | None = None
) -> Workload:
    """A workload entry of a scenario file, checked against the config."""
    if not isinstance(spec, dict):
        raise ScenarioError(f"{where}: expected a mapping")
    extra = set(spec) - _WORKLOAD_KEYS
    if extra:
        raise ScenarioError(f"{where}: unknown keys {sorted(extra)}")
    tenant = str(spec.get("tenant", ""))
    tcfg = config.tenant(tenant)
    if tcfg is None:
        raise ScenarioError(f"{where}.tenant: {tenant!r} is not a tenant of the config")
    model = spec.get("model")
    if model is None:
        if not tcfg.models:
            raise ScenarioError(f"{where}.model: required (tenant {tenant!r} may call any model)")
        model = tcfg.models[0]
    if config.model(str(model)) is None:
        raise ScenarioError(f"{where}.model: {model!r} is not a model of the config")
    if tcfg.models is not None and model not in tcfg.models:
        raise ScenarioError(f"{where}.model: tenant {tenant!r} may not call {model!r}")
    sla_ms = spec.get("sla_ms")
    if sla_ms is not None and (not _number(sla_ms) or sla_ms <= 0):
        raise ScenarioError(f"{where}.sla_ms: expected a positive number, got {sla_ms!r}")
    factor = spec.get("max_factor", 1.5)
    if not _number(factor) or factor <= 0:
        raise ScenarioError(f"{where}.max_factor: expected a positive number, got {factor!r}")
    cap = spec.get("max_cap", 4096)
    if not _number(cap) or cap < 1 or int(cap) != cap:
        raise ScenarioError(f"{where}.max_cap: expected an integer >= 1, got {cap!r}")
    return Workload(
        tenant=tenant,
        model=str(model),
        arrivals=parse_arrivals(spec.get("arrivals"), f"{where}.arrivals"),
        prompt=parse_dist(spec.get("prompt", 512), f"{where}.prompt", base=base),
        output=parse_dist(spec.get("output", 128), f"{where}.output", base=base),
        max_tokens=(
            parse_dist(spec["max_tokens"], f"{where}.max_tokens", base=base)
            if spec.get("max_tokens") is not None else None
        ),
        max_factor=float(factor),
        max_cap=int(cap),
        sla_s=float(sla_ms) / 1000.0 if sla_ms is not None else None,
    )


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def merge_streams(streams: Iterable[Iterator[Arrival]]) -> Iterator[Arrival]:
    """Merge time-ordered streams into one (ties: the earlier stream first)."""
    its = list(streams)
    if len(its) == 1:
        yield from its[0]
        return
    heap: list[tuple[float, int, Arrival, Iterator[Arrival]]] = []
    for i, it in enumerate(its):
        a = next(it, None)
        if a is not None:
            heap.append((a.t, i, a, it))
    heapify(heap)
    pop, replace = heappop, heapreplace
    while heap:
        _, i, a, it = heap[0]
        nxt = next(it, None)
        if nxt is None:
            pop(heap)
        else:
            replace(heap, (nxt.t, i, nxt, it))
        yield a


def generate(
    workloads: list[Workload], config: TriageConfig, *, seed: int, duration_s: float
) -> Iterator[Arrival]:
    """All workloads of a scenario as one time-ordered stream, deterministic per seed."""
    streams = []
    for i, w in enumerate(workloads):
        m = config.model(w.model)
        assert m is not None
        rng = random.Random(f"{seed}:{i}:{w.tenant}:{w.model}")
        streams.append(w.stream(rng, duration_s, m.context_tokens))
    return merge_streams(streams)
