"""The fetch count the admission app exports: what every fetch session of the process
sent, read at scrape (a consumer started again adds to the same figures)."""

from __future__ import annotations

import pytest
from aiokafka.protocol.fetch import FetchRequest, FetchRequest_v11
from prometheus_client import generate_latest

from triage.streams import fetch_sessions
from triage.streams.fetch_sessions import FetchCounts, FetchSession
from triage.streams.metrics import AdmissionMetrics


def _base() -> FetchRequest:
    return FetchRequest(20, 1, 1 << 20, 0, [("t", [(0, 10, 1024)])])


def _sent(s: FetchSession, session_id: int) -> None:
    """One fetch, sent (built as the client builds it) and answered."""
    req = s.request(_base())
    req.build(FetchRequest_v11)
    s.answered(req, 0, session_id)


def test_every_session_adds_its_fetches_to_the_process_count_read_at_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = FetchCounts()
    monkeypatch.setattr(fetch_sessions, "SENT", sent)
    metrics = AdmissionMetrics()
    text = generate_latest(metrics.registry).decode()
    assert 'triage_admission_fetches{kind="incremental"} 0.0' in text
    for broker in range(2):  # two brokers' sessions of one consumer ...
        s = FetchSession()
        for _ in range(4 + broker):  # the first opens the session: full
            _sent(s, 42 + broker)
    gone = FetchSession()  # ... and one of a consumer since replaced
    gone.request(_base())
    del gone
    text = generate_latest(metrics.registry).decode()
    assert 'triage_admission_fetches{kind="full"} 3.0' in text
    assert 'triage_admission_fetches{kind="incremental"} 7.0' in text
    sent.long_waits = 5
    assert "triage_admission_fetch_long_waits 5.0" in generate_latest(metrics.registry).decode()
