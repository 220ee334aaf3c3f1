"""Named policies for comparisons: ONE table from a name to PolicyConfig fields.

Every entry is the same admission core with different flags (policy.py resolves
presets); nothing here implements a policy. A name may carry overrides,
``full+variance_buffer=1.3+preemption=false``, so an experiment can name any
point of the design space without a new table entry.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from triage.config.models import PolicyConfig
from triage.sim.errors import PolicyNameError

VARIANTS: dict[str, dict[str, Any]] = {
    "full": {"preset": "full"},
    "admit_all": {"preset": "admit_all"},
    "reject_only": {"preset": "reject_only"},
    "rate_limit_only": {"preset": "rate_limit_only"},
    "bounded_queue": {"preset": "bounded_queue"},
    "vtc": {"preset": "vtc"},
    "edf": {"preset": "edf"},
    "engine_queue_cap": {"preset": "engine_queue_cap"},
    "tpm_priority": {"preset": "tpm_priority"},
    "clairvoyant": {"preset": "clairvoyant"},
    "full-nobuffer": {"preset": "full", "variance_buffer": 1.0},
    "full-noborrow": {"preset": "full", "borrowing": False},
    "full-nopreempt": {"preset": "full", "preemption": False},
}
DEFAULT_POLICIES = tuple(VARIANTS)

# Knobs a variant inherits from the scenario's own policy section (timing and
# tuning); the flags that define a policy come from the variant alone.
_INHERITED = (
    "version", "tick_ms", "lookahead", "backfill_s", "preempt_sla_factor",
    "fair_share_tolerance", "deadline_s_per_token", "gpu_timeout_s", "hold_scope",
    "result_timeout_s",
)


def policy_config(
    name: str, base: PolicyConfig | None = None, extra: dict[str, dict[str, Any]] | None = None
) -> PolicyConfig:
    """The PolicyConfig called `name` (a variant, optionally `+key=value` overrides)."""
    head, *mods = name.split("+")
    table = {**VARIANTS, **(extra or {})}
    fields = table.get(head)
    if fields is None:
        raise PolicyNameError(
            f"unknown policy {head!r}; known: {', '.join(table)} (add +key=value to override)"
        )
    data: dict[str, Any] = {k: getattr(base, k) for k in _INHERITED} if base else {}
    data.update(fields)
    for mod in mods:
        key, sep, raw = mod.partition("=")
        if not sep or not key:
            raise PolicyNameError(f"policy {name!r}: {mod!r} is not key=value")
        data[key] = yaml.safe_load(raw)
    data["name"] = name
    try:
        return PolicyConfig.model_validate(data)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise PolicyNameError(f"policy {name!r}: {msgs}") from None


def parse_policies(text: str) -> list[str]:
    """`a,b,c` -> names, checked (duplicates removed, order kept)."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part and part not in names:
            policy_config(part)
            names.append(part)
    if not names:
        raise PolicyNameError("no policies given")
    return names
