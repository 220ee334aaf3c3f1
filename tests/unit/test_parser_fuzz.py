"""The request parser under fuzzing: any bytes in, one of three answers out, never an
exception, and every answer fit to be written (no lone surrogates, bounded details).
A parsed request is strict (no duplicate keys) and a work item can always be built."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.chaos.poison import poison_corpus
from triage.topics.jsonsafe import duplicate_key
from triage.topics.messages import InferenceRequest
from triage.topics.validation import DETAIL_MAX, Invalid, Unparseable, parse_request

LIMIT = 4096
SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

VALID: dict[str, Any] = {"request_id": "r-1", "tenant": "a", "model": "m8",
                         "prompt_tokens": 10, "max_tokens": 5, "prompt": "hi"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)


def _check(raw: bytes | str | None) -> InferenceRequest | Invalid | Unparseable:
    result = parse_request(raw, max_bytes=LIMIT)
    if isinstance(result, InferenceRequest):
        data = result.model_dump(mode="json")
        orjson.dumps(data)  # what the work item and the table record carry: always writable
        assert result.to_bytes()
        raw_bytes = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        assert raw_bytes is not None and len(raw_bytes) <= LIMIT
    elif isinstance(result, Invalid):
        assert 0 < len(result.request_id) <= 128
        assert len(result.detail) <= DETAIL_MAX
        result.detail.encode("utf-8")  # no lone surrogate reaches a reply
    else:
        assert isinstance(result, Unparseable)
        result.error.encode("utf-8")
    return result


@SETTINGS
@given(st.binary(max_size=6000))
def test_any_bytes_get_one_of_three_answers(raw: bytes) -> None:
    _check(raw)


@SETTINGS
@given(json_values)
def test_any_json_value_gets_one_of_three_answers(value: Any) -> None:
    _check(json.dumps(value).encode())


@SETTINGS
@given(st.text(max_size=300))
def test_any_text_gets_one_of_three_answers(text: str) -> None:
    _check(text)  # str input, lone surrogates included


@SETTINGS
@given(field=st.sampled_from([*VALID, "stream", "sla_ms", "metadata", "attempt", "extra"]),
       value=json_values)
def test_a_valid_request_with_one_field_replaced(field: str, value: Any) -> None:
    data = {**VALID, field: value}
    result = _check(json.dumps(data).encode())
    if not isinstance(result, InferenceRequest) and field != "request_id":
        assert isinstance(result, Invalid) and result.request_id == data["request_id"]


@SETTINGS
@given(field=st.sampled_from(list(VALID)), value=json_values)
def test_a_repeated_key_is_always_refused(field: str, value: Any) -> None:
    body = json.dumps(VALID)[:-1] + f", {json.dumps(field)}: {json.dumps(value)}}}"
    assert not isinstance(_check(body.encode()), InferenceRequest)


@SETTINGS
@given(cut=st.integers(min_value=0, max_value=200), junk=st.binary(max_size=8),
       depth=st.integers(min_value=0, max_value=3000))
def test_a_valid_request_cut_spliced_or_nested(cut: int, junk: bytes, depth: int) -> None:
    raw = json.dumps({**VALID, "metadata": {"k": "v"}}).encode()
    _check(raw[:cut] + junk + raw[cut:])
    nested = f'{{"request_id":"r-1","metadata":{"[" * depth}{"]" * depth}}}'.encode()
    assert not isinstance(_check(nested), InferenceRequest)


@SETTINGS
@given(text=st.text(), pos=st.integers(min_value=0, max_value=50),
       code=st.integers(min_value=0xD800, max_value=0xDFFF))
def test_a_lone_surrogate_anywhere_in_the_prompt_is_refused_with_a_reason(
    text: str, pos: int, code: int
) -> None:
    chars = [json.dumps(c)[1:-1] for c in text]  # each character's JSON escape, whole
    cut = min(pos, len(chars))
    prompt = "".join(chars[:cut]) + f"\\u{code:04x}x" + "".join(chars[cut:])
    raw = ('{"request_id":"r-1","tenant":"a","model":"m8","prompt_tokens":10,'
           f'"max_tokens":5,"prompt":"{prompt}"}}').encode()
    result = _check(raw)
    assert isinstance(result, Invalid) and "surrogate" in result.detail


def test_the_poison_corpus_parses_without_an_exception() -> None:
    for entry in poison_corpus(tenant="a", model="m8"):
        parse_request(entry.value, max_bytes=460_000)


def _written_keys(pairs: list[tuple[str, Any]], spaces: list[str]) -> bytes:
    """An object written key by key (repeats kept), with whitespace around each colon."""
    body = ",".join(f"{json.dumps(k)}{spaces[i % len(spaces)]}:{json.dumps(v)}"
                    for i, (k, v) in enumerate(pairs))
    return ("{" + body + "}").encode("utf-8", "surrogatepass")


def _first_repeat(raw: bytes) -> str | None:
    """The reference: the slow, exact search (every object's pairs, in order)."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys) and not found:
            found.append(next(k for i, k in enumerate(keys) if k in keys[:i]))
        return dict(items)

    json.loads(raw, object_pairs_hook=pairs)
    return found[0] if found else None


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(['a', 'b', 'a"', 'x":', '\\":', '']),
                          json_values), min_size=1, max_size=6),
       st.lists(st.sampled_from(["", " ", "\n\t", "\r "]), min_size=1, max_size=3))
def test_the_fast_duplicate_check_agrees_with_the_exact_search(
        pairs: list[tuple[str, Any]], spaces: list[str]) -> None:
    """Keys and string values that look like key ends (`x":`), whitespace before colons,
    nested objects: the fast path never misses a repeated key, and names the same one."""
    raw = _written_keys(pairs, spaces)
    assert duplicate_key(raw) == _first_repeat(raw)
    nested = b'{"outer":' + raw + b',"list":[1,' + raw + b'],"z":0}'
    assert duplicate_key(nested) == _first_repeat(nested)
