"""The outbox's commit pause: 20 ms while transactions are cheap, longer when they are not."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from triage.streams.committer import COMMIT_SPACING, CYCLE_S, MAX_CYCLE_S, next_cycle_s


def test_cheap_commits_keep_the_short_cycle() -> None:
    assert next_cycle_s(0.0) == CYCLE_S
    assert next_cycle_s(0.005) == CYCLE_S  # a 5 ms commit (ten tenants) changes nothing


def test_a_costly_commit_spaces_the_next_by_its_cost_up_to_the_cap() -> None:
    assert next_cycle_s(0.02) == COMMIT_SPACING * 0.02  # 60 ms after a 20 ms commit
    assert next_cycle_s(1.0) == MAX_CYCLE_S  # never more latency than the cap


@given(st.floats(0.0, 10.0), st.floats(0.0, 10.0))
def test_the_pause_is_bounded_and_grows_with_the_commit(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert CYCLE_S <= next_cycle_s(lo) <= next_cycle_s(hi) <= MAX_CYCLE_S
