"""Parsing and checking incoming requests: unparseable -> dead letter, wrong -> invalid reply."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from triage.config.models import TriageConfig
from triage.topics.messages import InferenceRequest
from triage.topics.reasons import ReasonCode

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$")  # same as messages.RequestId


@dataclass(frozen=True, slots=True)
class Unparseable:
    """Bytes that carry no request we could answer: they go to the dead-letter topic."""

    error: str


@dataclass(frozen=True, slots=True)
class Invalid:
    """A request we can answer, but not serve as written: it gets an `invalid` reply."""

    request_id: str
    reason: ReasonCode
    detail: str


def describe_validation_error(exc: ValidationError) -> str:
    """One line per bad field: `prompt_tokens: Input should be greater than ...`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<message>"
        parts.append(f"{loc}: {str(err['msg']).removeprefix('Value error, ')}")
    return "; ".join(parts)


def parse_request(raw: bytes | str | None) -> InferenceRequest | Invalid | Unparseable:
    """Decode one request message. Answerable errors need a usable request_id."""
    if raw is None:
        return Unparseable("empty message value")
    try:  # the common case in one pass through pydantic-core; errors take the slow path
        return InferenceRequest.model_validate_json(raw)
    except ValidationError:
        pass
    try:
        data: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return Unparseable(f"not JSON: {exc}")
    if not isinstance(data, dict):
        return Unparseable(f"expected a JSON object, got {type(data).__name__}")
    try:
        return InferenceRequest.model_validate(data)
    except ValidationError as exc:
        detail = describe_validation_error(exc)
        rid = data.get("request_id")
        if not _usable_id(rid):
            return Unparseable(f"no usable request_id to answer: {detail}")
        return Invalid(str(rid), ReasonCode.INVALID_REQUEST, detail)


def check_request(
    req: InferenceRequest, config: TriageConfig, topic_tenant: str | None
) -> Invalid | None:
    """The checks that need configuration: tenant, model, contract, context window."""
    rid = req.request_id
    if topic_tenant is not None and req.tenant != topic_tenant:
        return Invalid(
            rid,
            ReasonCode.TENANT_MISMATCH,
            f"tenant {req.tenant!r} in the payload, but the topic belongs to {topic_tenant!r}",
        )
    tenant = config.tenant(req.tenant)
    if tenant is None:
        return Invalid(rid, ReasonCode.UNKNOWN_TENANT, f"tenant {req.tenant!r} is not configured")
    model = config.model(req.model)
    if model is None:
        known = ", ".join(sorted(config.models_by_name))
        return Invalid(
            rid, ReasonCode.UNKNOWN_MODEL, f"unknown model {req.model!r} (known: {known})"
        )
    if tenant.models is not None and req.model not in tenant.models:
        return Invalid(
            rid,
            ReasonCode.MODEL_NOT_ALLOWED,
            f"tenant {req.tenant!r} may call {', '.join(tenant.models)}, not {req.model!r}",
        )
    total = req.prompt_tokens + req.max_tokens
    if total > model.context_tokens:
        return Invalid(
            rid,
            ReasonCode.CONTEXT_OVERFLOW,
            f"prompt_tokens + max_tokens = {total} exceeds the {model.context_tokens}-token "
            f"context of {req.model}",
        )
    return None


def _usable_id(rid: object) -> bool:
    return isinstance(rid, str) and 0 < len(rid) <= 128 and _ID_RE.fullmatch(rid) is not None
