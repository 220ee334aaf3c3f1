"""A corpus of odd request messages, each with the answer the admission app owes it.

Used by the unit tests (through AdmissionService), the integration test (through a
running app on the real broker) and the fault suite. Every entry is one message for a
tenant's request topic: its name, Kafka key, value bytes (None: a tombstone) and what
must come of it (`Expect`):

- INVALID: exactly one terminal reply under the key (= the id its body names), `invalid`.
- SERVED: exactly one terminal reply under the key, decided as usual (not `invalid`).
- DEAD_LETTER: a dead letter keyed by the key; no reply under it.
- DUPLICATE: the key is an earlier entry's id: that id still has exactly one terminal
  reply (this message adds none; a body that is not a copy is also dead-lettered).

Entries are built for one tenant and model and for the app's size limits, and must be
sent in order (DUPLICATE entries refer back). Large entries are repetitive, so a
producer with compression can carry them past Kafka's 1 MB limit, as the issue did.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, NamedTuple


class Expect(StrEnum):
    INVALID = "invalid"
    SERVED = "served"
    DEAD_LETTER = "dead_letter"
    DUPLICATE = "duplicate"


class Poison(NamedTuple):
    name: str
    key: bytes
    value: bytes | None
    expect: Expect


def poison_corpus(
    *, tenant: str, model: str, other_tenant: str = "someone-else", prefix: str = "poison",
    context_tokens: int = 8192, max_message_bytes: int = 460_000,
    max_prompt_bytes: int = 400_000,
) -> Iterator[Poison]:
    """The corpus, in sending order (97 kinds)."""
    n = 0

    def rid(name: str) -> str:
        nonlocal n
        n += 1
        return f"{prefix}-{n:03d}-{name}"[:128]

    def body(_id: str, **changes: Any) -> dict[str, Any]:
        data: dict[str, Any] = {"request_id": _id, "tenant": tenant, "model": model,
                                "prompt_tokens": 20, "max_tokens": 10, "prompt": "hello"}
        for k, v in changes.items():
            if v is _DROP:
                data.pop(k, None)
            else:
                data[k] = v
        return data

    def js(data: Any) -> bytes:
        return json.dumps(data, ensure_ascii=False).encode()

    def answered(name: str, expect: Expect, **changes: Any) -> Poison:
        r = rid(name)
        return Poison(name, r.encode(), js(body(r, **changes)), expect)

    def raw(name: str, expect: Expect, make: Any) -> Poison:
        """An entry whose bytes are written by hand; `make(id)` returns them."""
        r = rid(name)
        return Poison(name, r.encode(), make(r), expect)

    def dead(name: str, value: bytes | None) -> Poison:
        return Poison(name, rid(name).encode(), value, Expect.DEAD_LETTER)

    head = f'"tenant":"{tenant}","model":"{model}","prompt_tokens":20,"max_tokens":10'
    rng = random.Random(12)
    block = bytes(rng.randrange(256) for _ in range(1024))

    # --- not a request at all: dead letters ------------------------------------------
    yield dead("tombstone", None)
    yield dead("empty", b"")
    yield dead("whitespace", b"  \n\t ")
    yield dead("not-json", b"not json at all")
    yield dead("lone-brace", b"{")
    yield dead("truncated-object", b'{"request_id": "x-trunc", "tenant": ')
    yield dead("json-array", b"[1, 2, 3]")
    yield dead("json-string", b'"a string"')
    yield dead("json-number", b"42")
    yield dead("json-null", b"null")
    yield dead("json-true", b"true")
    yield dead("invalid-utf8", b"\xff\xfe\xfd")
    yield dead("utf16-json", js(body("x-utf16")).decode().encode("utf-16"))
    yield dead("single-quotes", b"{'request_id': 'x-single'}")
    yield dead("comment", b'{"request_id": "x-comment" /* hi */}')
    yield dead("nested-100k-arrays", b"[" * 100_000 + b"]" * 100_000)
    yield dead("nested-100k-objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    yield raw("nested-50k-field", Expect.DEAD_LETTER, lambda r: (
        f'{{"request_id":"{r}",{head},"metadata":'.encode() + b"[" * 50_000
        + b"]" * 50_000 + b"}"))
    yield dead("garbage-2mb", block * 2048)
    yield dead("zeros-2mb", b"\x00" * (2 * 1024 * 1024))
    yield raw("trailing-garbage", Expect.DEAD_LETTER, lambda r: js(body(r)) + b" trailing")
    yield raw("two-objects", Expect.DEAD_LETTER, lambda r: js(body(r)) + js(body(r)))
    yield raw("raw-control-char", Expect.DEAD_LETTER,
              lambda r: f'{{"request_id":"{r}",{head},"prompt":"a\x01b"}}'.encode())
    yield raw("number-100k-digits", Expect.DEAD_LETTER,
              lambda r: f'{{"request_id":"{r}",{head},"attempt":'.encode() + b"9" * 100_000
              + b"}")
    yield dead("bom-garbage", b"\xef\xbb\xbfnot json")
    yield dead("huge-kafka-key", b"{}")._replace(key=b"k" * 200_000)
    # --- an object, but no id to answer under: dead letters -----------------------------
    yield dead("no-request-id", js(body("x", request_id=_DROP)))
    yield dead("empty-request-id", js(body("x", request_id="")))
    yield dead("request-id-with-space", js(body("x", request_id="has space")))
    yield dead("request-id-too-long", js(body("x", request_id="x" * 129)))
    yield dead("request-id-number", js(body("x", request_id=17)))
    yield dead("request-id-null", js(body("x", request_id=None)))
    yield dead("request-id-lone-surrogate",
               f'{{"request_id":"a\\ud800",{head}}}'.encode())
    yield dead("too-large-without-id", js({"prompt": "x" * (max_message_bytes + 10)}))

    # --- readable, refused with a reason: `invalid` -------------------------------------
    yield answered("prompt-tokens-negative", Expect.INVALID, prompt_tokens=-4)
    yield answered("prompt-tokens-zero", Expect.INVALID, prompt_tokens=0)
    yield answered("prompt-tokens-fraction", Expect.INVALID, prompt_tokens=1.5)
    yield answered("prompt-tokens-float", Expect.INVALID, prompt_tokens=20.0)
    yield answered("prompt-tokens-string", Expect.INVALID, prompt_tokens="20")
    yield answered("prompt-tokens-bool", Expect.INVALID, prompt_tokens=True)
    yield answered("prompt-tokens-huge", Expect.INVALID, prompt_tokens=10**30)
    yield answered("max-tokens-nan", Expect.INVALID, max_tokens=float("nan"))
    yield answered("max-tokens-infinity", Expect.INVALID, max_tokens=float("inf"))
    yield answered("token-sum-absurd", Expect.INVALID, prompt_tokens=9_999_999,
                   max_tokens=9_999_999)
    yield answered("max-tokens-missing", Expect.INVALID, max_tokens=_DROP)
    yield answered("model-missing", Expect.INVALID, model=_DROP)
    yield answered("tenant-empty", Expect.INVALID, tenant="")
    yield answered("unknown-field", Expect.INVALID, priority=9)
    yield answered("stream-yes", Expect.INVALID, stream="yes")
    yield answered("stream-one", Expect.INVALID, stream=1)
    yield answered("sla-zero", Expect.INVALID, sla_ms=0)
    yield answered("sla-fraction", Expect.INVALID, sla_ms=10.5)
    yield answered("attempt-too-high", Expect.INVALID, attempt=1001)
    yield answered("created-at-negative", Expect.INVALID, created_at_ms=-1)
    yield answered("metadata-list", Expect.INVALID, metadata=["a"])
    yield answered("metadata-int-value", Expect.INVALID, metadata={"k": 1})
    yield answered("metadata-65-entries", Expect.INVALID,
                   metadata={f"k{i}": "v" for i in range(65)})
    yield answered("prompt-object", Expect.INVALID, prompt={"text": "hi"})
    yield raw("metadata-lone-surrogate", Expect.INVALID,
              lambda r: f'{{"request_id":"{r}",{head},"metadata":{{"k":"\\ud800"}}}}'.encode())
    yield raw("metadata-key-lone-surrogate", Expect.INVALID,
              lambda r: f'{{"request_id":"{r}",{head},"metadata":{{"\\udfff":"v"}}}}'.encode())
    yield raw("prompt-lone-high-surrogate", Expect.INVALID,
              lambda r: f'{{"request_id":"{r}",{head},"prompt":"a\\ud83db"}}'.encode())
    yield raw("prompt-lone-low-surrogate", Expect.INVALID,
              lambda r: f'{{"request_id":"{r}",{head},"prompt":"\\ude00"}}'.encode())
    yield raw("duplicate-key-tokens", Expect.INVALID,
              lambda r: f'{{"request_id":"{r}",{head},"prompt_tokens":30}}'.encode())
    yield raw("duplicate-key-metadata", Expect.INVALID,
              lambda r: f'{{"request_id":"{r}",{head},"metadata":{{"k":"a","k":"b"}}}}'.encode())
    yield raw("duplicate-key-request-id", Expect.INVALID,
              lambda r: f'{{"request_id":"x-first",{head},"request_id":"{r}"}}'.encode())
    yield raw("bom-prefix", Expect.INVALID, lambda r: b"\xef\xbb\xbf" + js(body(r)))
    yield answered("tenant-mismatch", Expect.INVALID, tenant=other_tenant)
    yield answered("unknown-model", Expect.INVALID, model="no-such-model")
    yield answered("context-overflow", Expect.INVALID, prompt_tokens=context_tokens,
                   max_tokens=10)
    yield answered("prompt-over-limit", Expect.INVALID, prompt="p" * (max_prompt_bytes + 1))
    yield answered("prompt-2mb", Expect.INVALID, prompt="p" * (2 * 1024 * 1024))
    yield answered("prompt-4m-chars", Expect.INVALID, prompt="x" * 4_000_000)
    yield answered("messages-not-a-list", Expect.INVALID, messages={"role": "user"})
    yield answered("messages-bad-role", Expect.INVALID,
                   messages=[{"role": "root", "content": "hi"}])
    yield answered("messages-content-number", Expect.INVALID,
                   messages=[{"role": "user", "content": 7}])
    yield raw("messages-lone-surrogate", Expect.INVALID, lambda r: (
        f'{{"request_id":"{r}",{head},"messages":[{{"role":"user","content":"\\ud800"}}]}}'
        .encode()))
    yield answered("messages-over-limit", Expect.INVALID, prompt=_DROP,
                   messages=[{"role": "user", "content": "m" * (max_prompt_bytes // 2 + 8)},
                             {"role": "user", "content": "m" * (max_prompt_bytes // 2 + 8)}])

    # --- odd but valid: decided as usual ------------------------------------------------
    served = answered("prompt-null", Expect.SERVED, prompt=None)
    yield served
    yield answered("sla-null", Expect.SERVED, sla_ms=None)
    yield answered("prompt-emoji-pair", Expect.SERVED, prompt="\U0001f600 ok")
    yield answered("prompt-nul-char", Expect.SERVED, prompt="a\x00b")
    yield answered("prompt-escapes", Expect.SERVED, prompt='\n\t\r\b\f"\\/ \x7f')
    yield answered("prompt-rtl-combining", Expect.SERVED, prompt="שלום e\u0301 \u202e")
    yield answered("metadata-64-long", Expect.SERVED,
                   metadata={f"k{i}": "v" * 1000 for i in range(64)})
    yield raw("whitespace-around", Expect.SERVED, lambda r: b" \n" + js(body(r)) + b"\n ")
    yield raw("keys-reordered", Expect.SERVED, lambda r: js(dict(reversed(body(r).items()))))
    yield answered("chat-messages", Expect.SERVED, prompt=_DROP,
                   messages=[{"role": "system", "content": "be brief"},
                             {"role": "user", "content": "hi \u00e9"}])
    near = max_prompt_bytes - 4096  # leaves room for the rest of the message
    for i in range(3):  # sent back to back: some must queue (their records near 1 MB)
        yield answered(f"prompt-near-limit-{i}", Expect.SERVED, prompt="q" * near)
    escapes = min(near, max_message_bytes - 4096) // 6  # \u0001 is 6 bytes on the wire
    yield answered("prompt-near-limit-escapes", Expect.SERVED, prompt="\x01" * escapes)

    # --- the id of an earlier request again: nothing new for that id --------------------
    first = served.key.decode()
    yield Poison("redelivered-copy", served.key, served.value, Expect.DUPLICATE)
    yield Poison("invalid-body-under-finished-id", served.key,
                 js(body(first, prompt_tokens=-1)), Expect.DUPLICATE)
    yield Poison("other-tenant-body-under-finished-id", served.key,
                 js(body(first, tenant=other_tenant)), Expect.DUPLICATE)
    bad = rid("invalid-then-copied")
    yield Poison("invalid-then-copied", bad.encode(), js(body(bad, max_tokens=0)),
                 Expect.INVALID)
    yield Poison("invalid-copy", bad.encode(), js(body(bad, max_tokens=0)), Expect.DUPLICATE)
    yield Poison("valid-body-under-invalid-id", bad.encode(), js(body(bad)), Expect.DUPLICATE)


_DROP = object()
