"""Reading untrusted JSON without letting it hurt the reader. Pure functions.

Python's `json` module recurses once per nesting level, so 100,000 nested brackets
raise RecursionError (not ValueError) in whoever parses them. Here every parse of
untrusted bytes goes through jiter (pydantic-core's parser), which refuses nesting
deeper than 200 levels with a ValueError, and sizes are checked before parsing.
The duplicate-key check (orjson, and `json.loads` when its fast path cannot
decide) runs only on bytes that already passed the schema, which allows two levels of
nesting.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pydantic_core

BOM = b"\xef\xbb\xbf"
PEEK_MAX_BYTES = 16 * 1024 * 1024  # past this a refused message is not parsed at all
# \uD800-\uDFFF written as JSON escapes; jiter refuses lone ones (a pair is fine)
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# where a key may end: a quote, optional whitespace, a colon. Every key of the text ends
# so; a string's content may too (`"a \\":"`), so this counts keys or more, never fewer
KEY_END = re.compile(rb'"[ \t\n\r]*:')


def peek(raw: bytes) -> Any:
    """Parse refused bytes to learn what they claim to be (their request_id), with the
    bounded parser. Lone surrogate escapes are read as U+FFFD. `None` when nothing can be
    read (a JSON `null` is as useless to the caller)."""
    if len(raw) > PEEK_MAX_BYTES:
        return None
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        pass
    if not SURROGATE_ESCAPE.search(raw):
        return None
    try:
        return pydantic_core.from_json(SURROGATE_ESCAPE.sub(rb"\\ufffd", raw))
    except ValueError:
        return None


def _keys(obj: dict[str, Any]) -> int:
    """Keys in `obj` and in the objects nested in it (shallow: the schema has passed)."""
    n = len(obj)
    for v in obj.values():
        if type(v) is dict:
            n += _keys(v)
        elif type(v) is list:
            n += sum(_keys(x) for x in v if type(x) is dict)
    return n


def duplicate_key(raw: bytes) -> str | None:
    """The first key that appears twice in one object, or None. Only for bytes whose
    nesting is already known to be shallow (they passed a schema): `json` recurses.

    Fast path (most requests): parsing keeps one of each key, so when the parsed objects
    hold as many keys as the text has places where a key may end (KEY_END, an upper
    bound of the keys written), no key was written twice. Otherwise, or when orjson
    refuses what jiter read, the exact search below names the key."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if type(parsed) is dict and _keys(parsed) == len(KEY_END.findall(raw)):
        return None
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items) and not found:
            seen: set[str] = set()
            for k, _ in items:
                if k in seen:
                    found.append(k)
                    break
                seen.add(k)
        return obj

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # jiter read it; refuse what json cannot
        return "<unreadable>"
    return found[0] if found else None


def is_unicode(s: str) -> bool:
    """True unless `s` holds a lone UTF-16 surrogate (which no UTF-8 writer can encode)."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def safe_text(s: str, limit: int) -> str:
    """`s` cut to `limit` characters, lone surrogates written as `\\udXXX` escapes: fit
    for a reply, a dead letter or a log line."""
    cut = s if len(s) <= limit else s[: max(0, limit - 1)] + "…"
    return cut if is_unicode(cut) else cut.encode("utf-8", "backslashreplace").decode("utf-8")
