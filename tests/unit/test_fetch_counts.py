"""The fetch count the admission app exports: read from its fetch sessions at scrape."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from triage.streams import fetch_sessions
from triage.streams.fetch_sessions import FetchSession, SessionClient
from triage.streams.metrics import AdmissionMetrics


def _client(*counts: tuple[int, int]) -> SessionClient:
    client = SessionClient(object())
    for node, (full, incremental) in enumerate(counts):
        session = client.sessions[node] = FetchSession()
        session.full_fetches, session.incremental_fetches = full, incremental
    return client


def test_fetches_are_summed_over_every_installed_client_at_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed: list[SessionClient] = []
    monkeypatch.setattr(fetch_sessions, "INSTALLED", installed)
    metrics = AdmissionMetrics()
    text = generate_latest(metrics.registry).decode()
    assert 'triage_admission_fetches{kind="incremental"} 0.0' in text
    installed += [_client((2, 30), (1, 7)), _client((1, 0))]  # consumers started later
    text = generate_latest(metrics.registry).decode()
    assert 'triage_admission_fetches{kind="full"} 4.0' in text
    assert 'triage_admission_fetches{kind="incremental"} 37.0' in text
