"""Parsing and checking incoming requests: unparseable -> dead letter, wrong -> invalid reply."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from triage.config.models import TriageConfig
from triage.topics.jsonsafe import BOM, SURROGATE_ESCAPE, duplicate_key, peek, safe_text
from triage.topics.messages import InferenceRequest
from triage.topics.reasons import ReasonCode

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$")  # same as messages.RequestId
_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")  # same as messages.ModelName
DETAIL_MAX = 2000  # Reply.detail's bound


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
    model: str | None = None  # the model it named, when usable (for the audit log)


def describe_validation_error(exc: ValidationError) -> str:
    """One line per bad field: `prompt_tokens: Input should be greater than ...`. Field
    names come from the input, so each is cut short and made printable."""
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(safe_text(str(x), 64) for x in err["loc"]) or "<message>"
        parts.append(f"{loc}: {safe_text(str(err['msg']).removeprefix('Value error, '), 300)}")
    return safe_text("; ".join(parts), DETAIL_MAX)


def parse_request(
    raw: bytes | str | None, *, max_bytes: int | None = None
) -> InferenceRequest | Invalid | Unparseable:
    """Decode one request message, refusing what a strict reader must refuse: more than
    `max_bytes`, a byte order mark, duplicate keys, wrong JSON types, lone surrogates.
    Never raises on any input, and never recurses on it. Answerable errors need a usable
    request_id; the rest is dead-lettered."""
    if raw is None:
        return Unparseable("empty message value")
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if max_bytes is not None and len(raw) > max_bytes:
        return _refuse(raw, f"message is {len(raw)} bytes, above the {max_bytes}-byte limit "
                            "(admission.max_message_bytes)")
    if raw.startswith(BOM):
        return _refuse(raw[len(BOM):], "message starts with a UTF-8 byte order mark: send "
                                       "JSON text without one (RFC 8259, section 8.1)")
    try:  # the common case in one pass through pydantic-core; errors take the slow path
        req = InferenceRequest.model_validate_json(raw)
    except ValidationError as exc:
        return _explain(raw, exc)
    dup = duplicate_key(raw)
    if dup is not None:
        return Invalid(req.request_id, ReasonCode.INVALID_REQUEST,
                       f"duplicate key {safe_text(dup, 64)!r}: each key may appear once",
                       req.model)
    return req


def answerable_id(raw: bytes | None) -> str | None:
    """The usable request_id that some bytes claim, if any (bounded parse)."""
    data = peek(raw) if raw else None
    rid = data.get("request_id") if isinstance(data, dict) else None
    return rid if isinstance(rid, str) and _usable_id(rid) else None


def _explain(raw: bytes, exc: ValidationError) -> Invalid | Unparseable:
    errors = exc.errors()
    if errors and errors[0]["type"] == "json_invalid":
        msg = safe_text(str(errors[0]["msg"]).removeprefix("Invalid JSON: "), 300)
        data = peek(raw)  # reads past lone surrogates, which jiter refuses
        if not isinstance(data, dict):
            return Unparseable(f"not JSON: {msg}")
        if SURROGATE_ESCAPE.search(raw):
            msg = f"not valid Unicode text ({msg}): a lone UTF-16 surrogate is not a character"
        return _refuse_parsed(data, msg)
    data = peek(raw)
    if not isinstance(data, dict):
        return Unparseable(f"expected a JSON object, got {_json_type(data)}")
    return _refuse_parsed(data, describe_validation_error(exc))


def _refuse(raw: bytes, detail: str) -> Invalid | Unparseable:
    """Refuse bytes before parsing them fully: answer when they name a usable id."""
    data = peek(raw)
    if not isinstance(data, dict):
        return Unparseable(detail)
    return _refuse_parsed(data, detail)


def _refuse_parsed(data: dict[str, Any], detail: str) -> Invalid | Unparseable:
    rid = data.get("request_id")
    if not isinstance(rid, str) or not _usable_id(rid):
        return Unparseable(f"no usable request_id to answer: {detail}")
    model = data.get("model")
    hint = model if isinstance(model, str) and _MODEL_RE.fullmatch(model) else None
    return Invalid(rid, ReasonCode.INVALID_REQUEST, detail, hint)


def _json_type(data: Any) -> str:
    names = {list: "an array", str: "a string", int: "a number", float: "a number",
             bool: "a boolean", type(None): "null"}
    return names.get(type(data), type(data).__name__)


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
    limit = config.admission.max_prompt_bytes
    texts = [req.prompt or "", *(m.content for m in req.messages or ())]
    if sum(map(len, texts)) * 4 > limit:  # UTF-8 takes at most 4 bytes a character
        size = sum(len(t.encode("utf-8")) for t in texts)
        if size > limit:
            what = "prompt" if req.messages is None else "prompt and messages"
            return Invalid(rid, ReasonCode.INVALID_REQUEST,
                           f"{what}: {size} bytes of UTF-8, above the {limit}-byte limit "
                           "(admission.max_prompt_bytes)", req.model)
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
