"""Recorded requests as the simulator's arrivals: times, recorded ids, output tokens.

Times: virtual seconds from an origin, the first arrival's second rounded down to the
candidate's tick grid, so the core's ticks keep their phase against recorded times.

Output tokens (what the simulated GPU generates): a recorded completion's count when the
request completed; otherwise the tenant's output ratio learned, with the predictor's own
OutputRatio (decayed, seeded with the tenant's `output_ratio_prior`), from the recorded
completions of the range, times max_tokens. The report says how many came from each.

Requests the candidate configuration cannot serve as written (unknown tenant or model,
a model outside the tenant's contract, a context overflow) are not simulated: the app
would answer them `invalid` before any policy runs, and so does replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from triage.admission.predictor import OutputRatio
from triage.config.models import TriageConfig
from triage.replay.recording import RecordedRequest
from triage.sim.workload import Arrival
from triage.topics.messages import InferenceRequest
from triage.topics.reasons import ReasonCode
from triage.topics.validation import Invalid, check_request


@dataclass(slots=True)
class OutputSources:
    """Where the simulated output token counts came from."""

    recorded: int = 0  # a recorded completion said
    learned: int = 0  # the tenant's learned ratio x max_tokens
    ratios: dict[str, float] = field(default_factory=dict)  # tenant -> the ratio used


def origin_ms(first_ms: int, tick_ms: int) -> int:
    """Virtual time zero: the first arrival's whole second, on the tick grid."""
    o = first_ms - first_ms % 1000
    return o - o % tick_ms


def invalid_under(r: RecordedRequest, config: TriageConfig) -> Invalid | None:
    """Why the candidate configuration refuses the request as written (None: it may run)."""
    try:
        req = InferenceRequest(
            request_id=r.request_id, tenant=r.tenant, model=r.model,
            prompt_tokens=r.prompt_tokens, max_tokens=r.max_tokens,
        )
    except ValidationError as exc:
        return Invalid(r.request_id, ReasonCode.INVALID_REQUEST, str(exc))
    return check_request(req, config, None)


def learned_ratios(requests: list[RecordedRequest], config: TriageConfig) -> dict[str, float]:
    """Each tenant's output ratio after the range's recorded completions, in arrival order."""
    half_life = config.predictor.learning_half_life
    ratios = {
        t.name: OutputRatio(prior=t.output_ratio_prior, half_life=half_life)
        for t in config.tenants
    }
    seen: set[str] = set()
    for r in requests:
        seen.add(r.tenant)
        ratio = ratios.get(r.tenant)
        if ratio is not None and r.output_tokens is not None:
            ratio.observe(r.output_tokens, r.max_tokens)
    return {t: ratio.value for t, ratio in ratios.items() if t in seen}


def to_arrivals(
    requests: list[RecordedRequest], config: TriageConfig, origin: int
) -> tuple[list[Arrival], OutputSources]:
    """Arrivals in the requests' order (already valid under `config`), with recorded ids."""
    sources = OutputSources(ratios=learned_ratios(requests, config))
    out: list[Arrival] = []
    for r in requests:
        if r.output_tokens is not None:
            sources.recorded += 1
            generated = r.output_tokens
        else:
            sources.learned += 1
            generated = round(sources.ratios.get(r.tenant, 1.0) * r.max_tokens)
        out.append(Arrival(
            t=(r.arrived_ms - origin) / 1000.0, tenant=r.tenant, model=r.model,
            prompt_tokens=r.prompt_tokens, max_tokens=r.max_tokens,
            output_tokens=max(1, min(r.max_tokens, generated)), sla_s=r.sla_s,
            request_id=r.request_id,
        ))
    return out, sources
