"""A stored request record's envelope: the outputs it caused and its tenant's bucket
travel beside it, byte for byte, and records written in the earlier JSON envelope (kept
in RocksDB and in changelogs from before) still read back the same."""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from triage.streams.store import ENVELOPE, ENVELOPE2, Bucket, unwrap, wrap

RECORD = b'{"request_id": "r1", "state": "running"}'

outputs = st.lists(st.tuples(st.integers(0, 2**62), st.text(min_size=1, max_size=40),
                             st.binary(max_size=300)), max_size=6)
buckets = st.none() | st.builds(Bucket, st.floats(-1e12, 1e12), st.floats(0, 2e9),
                                st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)))


@given(outs=outputs, bucket=buckets)
def test_what_is_wrapped_unwraps_unchanged(outs: list[tuple[int, str, bytes]],
                                           bucket: Bucket | None) -> None:
    raw = wrap(RECORD, outs, bucket)
    env = unwrap(raw)
    assert env.record == RECORD
    assert env.outputs == outs
    assert env.tenant_bucket == bucket


def test_a_record_with_nothing_beside_it_is_stored_as_it_is() -> None:
    assert wrap(RECORD) == RECORD
    assert unwrap(RECORD) == (RECORD, [], None)


def test_outputs_are_framed_not_escaped_into_json() -> None:
    value = b'{"text": "a \\"quoted\\" word", "x": [1, 2]}'
    raw = wrap(RECORD, [(7, "t.decisions", value)])
    assert raw.startswith(ENVELOPE2) and value in raw  # copied as it is


def test_a_record_in_the_earlier_json_envelope_still_reads() -> None:
    value = '{"request_id": "r1", "note": "caf\u00e9"}'.encode()
    meta = orjson.dumps({"o": [[3, "t.replies.a", value.decode("latin-1")]],
                         "b": [12.5, 100.0, 3, 9]})
    old = ENVELOPE + struct.pack(">I", len(meta)) + meta + RECORD
    env = unwrap(old)
    assert env.record == RECORD
    assert env.outputs == [(3, "t.replies.a", value)]
    assert env.tenant_bucket == Bucket(12.5, 100.0, (3, 9))


def test_an_envelope_cut_short_is_an_error_not_a_shorter_record() -> None:
    raw = wrap(RECORD, [(1, "t.decisions", b"x" * 50)])
    with pytest.raises((ValueError, struct.error)):
        unwrap(raw[:20])
