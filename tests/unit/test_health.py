"""Readiness follows what the app does (ticks handled, outputs committing, partitions
assigned), over real HTTP; and live GPUs are not declared lost for the app's own
silence (liveness.py)."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from triage.ports import free_port
from triage.streams.health import Health
from triage.streams.liveness import HeartbeatGuard
from triage.streams.metrics import AdmissionMetrics


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_ready_only_while_ticks_flow_and_outputs_commit() -> None:
    clock = Clock()
    h = Health(clock=clock, started=clock())
    assert h.check() == (False, "recovering state")  # the group has not answered yet
    h.held = 1
    assert h.check() == (False, "recovering state")
    h.restored = True
    h.ticked()
    assert h.check()[0]
    clock.t += 6.0  # no tick handled for 6 s: the broker or the loop is gone
    ok, why = h.check()
    assert not ok and why.startswith("not deciding")
    h.ticked()
    h.publishing_since = clock()
    clock.t += 5.5
    h.ticked()
    ok, why = h.check()
    assert not ok and why.startswith("outputs not committed")
    h.publishing_since = None
    h.held = 0
    assert h.check() == (False, "no shard assigned (a standby until the group gives it one)")


def test_live_fails_only_when_the_event_loop_stalls() -> None:
    clock = Clock()
    h = Health(clock=clock, started=clock())
    h.restored = True
    h.beat()
    clock.t += 20.0  # unready by now, but alive
    assert not h.check()[0] and h.live()[0]
    clock.t += 11.0
    assert not h.live()[0]


def test_http_endpoints_and_the_gauge_tell_the_same_story() -> None:
    clock = Clock()
    h = Health(clock=clock, started=clock())
    m = AdmissionMetrics(CollectorRegistry())
    port = m.serve("127.0.0.1", free_port(), ready=h.check, live=h.live)
    try:
        base = f"http://127.0.0.1:{port}"
        assert _get(f"{base}/ready") == (503, "recovering state\n")
        assert "triage_admission_ready 0.0" in _get(f"{base}/metrics")[1]
        h.restored = True
        h.ticked()
        h.beat()
        assert _get(f"{base}/ready") == (200, "deciding\n")
        assert "triage_admission_ready 1.0" in _get(f"{base}/metrics")[1]
        assert _get(f"{base}/live")[0] == 200
        clock.t += 10.0
        assert _get(f"{base}/ready")[0] == 503
        assert "triage_admission_ready 0.0" in _get(f"{base}/metrics")[1]
        assert _get(f"{base}/nope")[0] == 404
    finally:
        assert m.server is not None
        m.server.shutdown()


def test_heartbeats_are_applied_again_while_the_app_is_behind_on_them() -> None:
    clock = Clock()
    g = HeartbeatGuard(clock)
    assert not g.should_refresh(highwater=None)  # nothing heard yet: nothing to apply
    g.seen(b"g0", b"hb0", offset=4)
    clock.t += 0.05
    assert not g.should_refresh(highwater=5)  # read up to the end: silence is real
    clock.t += 0.05
    assert g.should_refresh(highwater=900)  # heartbeats wait unread behind a flood
    g.seen(b"g0", b"hb1", offset=899)
    clock.t += 0.05
    assert not g.should_refresh(highwater=900)
    clock.t += 30.0  # the app was not listening (broker outage)
    assert g.should_refresh(highwater=900)
    for _ in range(110):  # ticks every 50 ms again: grace runs out after 5 s
        clock.t += 0.05
        last = g.should_refresh(highwater=900)
    assert not last  # caught up and the grace is over


def test_gap_guard_names_the_offsets_faust_jumped_over() -> None:
    from triage.streams.gaps import GapGuard

    g = GapGuard()
    g.start_at({("t.requests.a", 0): 6000})
    assert g.check("t.requests.a", 0, 6164) == (6000, 6164)  # 6000..6163 never seen
    assert g.check("t.requests.a", 0, 6165) is None
    # after the first offset, a jump is a transaction's commit marker, not a skip
    assert g.check("t.requests.a", 0, 6167) is None
    assert g.check("t.requests.b", 0, 7) is None  # no start known: begins where it begins
    g.start_at({("t.requests.c", 1): 50})
    assert g.check("t.requests.c", 1, 50) is None  # started where committed: no gap
    assert g.check("t.requests.c", 1, 60) is None
    g.forget(1)
    g.start_at({("t.requests.c", 1): 70})  # adopted again: checked again
    assert g.check("t.requests.c", 1, 75) == (70, 75)


def test_gap_guard_reads_again_what_faust_dropped_mid_stream_around_a_rebalance() -> None:
    from triage.streams.gaps import WATCH_S, GapGuard

    g = GapGuard()
    g.start_at({("t.requests.late", 0): 0})
    assert [g.check("t.requests.late", 0, o, now=1.0) for o in range(50)] == [None] * 50
    g.watch(now=1.0)  # a rebalance: Faust dropped offset 50, then handed out 59 twice
    assert g.check("t.requests.late", 0, 51, now=1.5) == (50, 51)
    assert [g.check("t.requests.late", 0, o, now=1.5) for o in (52, 59, 59)] == [
        None, (53, 59), None]  # a repeat is no gap
    # past the watch, a jump is a commit marker again
    assert g.check("t.requests.late", 0, 61, now=1.0 + WATCH_S + 0.1) is None
    g.watch(now=100.0)
    assert g.check("t.requests.late", 0, 60, now=100.5) is None  # behind: no gap
    assert g.check("t.requests.late", 0, 63, now=100.5) == (62, 63)
    # a shard kept across a rebalance: Faust rewinds, and may not jump past what it gave
    g.resume(0)
    assert g.check("t.requests.late", 0, 40, now=1000.0) is None
    g.resume(0)
    assert g.check("t.requests.late", 0, 70, now=1000.0) == (64, 70)
