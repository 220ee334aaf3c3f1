"""Policies as configuration: the full policy and the baselines are one core with flags.

A preset fixes the flags; explicit fields in PolicyConfig override the preset, so
"full without preemption" is `preset: full, preemption: false`.
"""

from __future__ import annotations

from typing import ClassVar, Final

from triage.admission.record import Record
from triage.config.models import PolicyConfig, PolicyPreset

_FLAG_FIELDS = (
    "name",
    "version",
    "quota",
    "borrowing",
    "memory_fit",
    "sla_fit",
    "queue",
    "fairness",
    "preemption",
    "hysteresis",
    "variance_buffer",
    "preempt_sla_factor",
    "lookahead",
    "backfill_s",
    "fair_share_tolerance",
)


class PolicyFlags(Record):
    """Which checks run; every decision names the policy that made it. (A compiled value
    record: the dispatcher reads these flags on every decision.)"""

    __slots__ = _FLAG_FIELDS
    _fields: ClassVar[tuple[str, ...]] = _FLAG_FIELDS

    def __init__(
        self,
        *,
        name: str,
        version: str,
        quota: bool,
        borrowing: bool,
        memory_fit: bool,
        sla_fit: bool,
        queue: bool,
        fairness: bool,
        preemption: bool,
        hysteresis: bool,
        variance_buffer: float | None,
        preempt_sla_factor: float,
        lookahead: int,
        backfill_s: float,
        fair_share_tolerance: float,
    ) -> None:
        self.name: Final = name  # shown on every decision record
        self.version: Final = version  # policy version, bumped when knobs change
        self.quota: Final = quota  # check 1: token bucket per tenant
        self.borrowing: Final = borrowing  # buckets may go into debt up to their ceiling
        self.memory_fit: Final = memory_fit  # check 2: KV reservations on the ledger
        self.sla_fit: Final = sla_fit  # check 3: predicted time x buffer against the SLA
        self.queue: Final = queue  # wait in the bounded queue (off: refuse instead)
        self.fairness: Final = fairness  # check 4: weighted fair order (off: FIFO by arrival)
        self.preemption: Final = preemption  # preempt a runner for a tighter, more urgent one
        self.hysteresis: Final = hysteresis  # tighten admission above the high threshold
        # fixed buffer; None: the predictor's adaptive buffer
        self.variance_buffer: Final = variance_buffer
        # preempt only if queued slack < factor x runner remaining
        self.preempt_sla_factor: Final = preempt_sla_factor
        self.lookahead: Final = lookahead  # tenants a dispatch pass may try past a blocked one
        # a blocked head may be passed only while it has waited less than this
        self.backfill_s: Final = backfill_s
        # tightened pools hold back tenants above this share
        self.fair_share_tolerance: Final = fair_share_tolerance


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
    return list(PolicyFlags._fields)
