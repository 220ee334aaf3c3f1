"""Policies as configuration: the full policy and the baselines are one core with flags.

A preset fixes the flags; explicit fields in PolicyConfig override the preset, so
"full without preemption" is `preset: full, preemption: false`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from triage.config.models import PolicyConfig, PolicyPreset


@dataclass(frozen=True, slots=True)
class PolicyFlags:
    """Which checks run; every decision names the policy that made it."""

    name: str  # shown on every decision record
    version: str  # policy version, bumped when knobs change
    quota: bool  # check 1: token bucket per tenant
    borrowing: bool  # buckets may go into debt up to their ceiling
    memory_fit: bool  # check 2: KV reservations on the ledger
    sla_fit: bool  # check 3: predicted time x buffer against the SLA
    queue: bool  # wait in the bounded queue (off: refuse instead)
    fairness: bool  # check 4: weighted fair order (off: FIFO by arrival)
    preemption: bool  # preempt a runner for a tighter, higher-priority request
    hysteresis: bool  # tighten admission above the high threshold
    variance_buffer: float | None  # fixed buffer; None: the predictor's adaptive buffer
    preempt_sla_factor: float  # preempt only if queued slack < factor x runner remaining
    lookahead: int  # tenants a dispatch pass may try past a blocked one
    backfill_s: float  # a blocked head may be passed only while it has waited less than this
    fair_share_tolerance: float  # tightened pools hold back tenants above this share


_PRESETS: dict[PolicyPreset, dict[str, bool]] = {
    PolicyPreset.FULL: {
        "quota": True, "borrowing": True, "memory_fit": True, "sla_fit": True, "queue": True,
        "fairness": True, "preemption": True, "hysteresis": True,
    },
    # An engine with no front door: everything goes straight to a GPU.
    PolicyPreset.ADMIT_ALL: {
        "quota": False, "borrowing": False, "memory_fit": False, "sla_fit": False, "queue": False,
        "fairness": False, "preemption": False, "hysteresis": False,
    },
    # Admission checks, but whatever would wait is refused.
    PolicyPreset.REJECT_ONLY: {
        "quota": True, "borrowing": True, "memory_fit": True, "sla_fit": True, "queue": False,
        "fairness": False, "preemption": False, "hysteresis": False,
    },
    # Tenant quota and nothing else: what passes goes straight to a GPU.
    PolicyPreset.RATE_LIMIT_ONLY: {
        "quota": True, "borrowing": True, "memory_fit": False, "sla_fit": False, "queue": False,
        "fairness": False, "preemption": False, "hysteresis": False,
    },
    # KV fit plus a bounded FIFO queue with timeouts; no quota, no SLA, no fairness.
    PolicyPreset.BOUNDED_QUEUE: {
        "quota": False, "borrowing": False, "memory_fit": True, "sla_fit": False, "queue": True,
        "fairness": False, "preemption": False, "hysteresis": False,
    },
}


def resolve_policy(cfg: PolicyConfig) -> PolicyFlags:
    """Preset flags, overridden by any flag set explicitly in the config."""
    flags = dict(_PRESETS[cfg.preset])
    for name in flags:
        value = getattr(cfg, name)
        if value is not None:
            flags[name] = bool(value)
    return PolicyFlags(
        # an unnamed baseline is called by its preset
        name=cfg.preset.value if cfg.name == "full" and cfg.preset is not PolicyPreset.FULL
        else cfg.name,
        version=cfg.version,
        variance_buffer=cfg.variance_buffer,
        preempt_sla_factor=cfg.preempt_sla_factor,
        lookahead=cfg.lookahead,
        backfill_s=cfg.backfill_s,
        fair_share_tolerance=cfg.fair_share_tolerance,
        **flags,
    )


def flag_names() -> list[str]:
    return [f.name for f in fields(PolicyFlags)]
