"""The fault suite, reduced for CI: each scenario of `triage chaos` on a broker of its
own (stopped and started by the broker scenario), the real admission app and two sim
workers as processes, requests from an outside client.

Run: `.venv/bin/pytest -q -m faults tests/faults` (a few minutes; ports 9392-9395 must
be free, or set TRIAGE_CHAOS_PORT: the forgery scenario's secured broker takes the
next pair). The full suite is `triage chaos`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from triage.chaos.plan import ALL, ChaosPlan, Scenario
from triage.chaos.runner import run_scenario
from triage.kafka.local import LocalBroker

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.fixture(scope="module")
def chaos_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    port = int(os.environ.get("TRIAGE_CHAOS_PORT", "9392"))
    broker = LocalBroker(port=port, controller_port=port + 1,
                         data_dir=tmp_path_factory.mktemp("chaos-broker"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


# One topic pair for every tenant (kafka.tenant_topics: shared) changes where requests
# come from and replies go (the tenant is the request's): the faults that touch those.
SHARED = [Scenario.APP_KILL, Scenario.POISON, Scenario.CONFIG]
RUNS = [(s, "per_tenant") for s in ALL] + [(s, "shared") for s in SHARED]


@pytest.mark.parametrize(("scenario", "tenant_topics"), RUNS,
                         ids=[s.value + ("-shared" if t == "shared" else "") for s, t in RUNS])
def test_no_request_is_lost_duplicated_or_run_twice(
    chaos_broker: LocalBroker, scenario: Scenario, tenant_topics: str, tmp_path: Path
) -> None:
    plan = ChaosPlan.reduced(scenarios=[scenario], port=chaos_broker.port,
                             secure_port=chaos_broker.port + 2, tenant_topics=tenant_topics)
    res = run_scenario(scenario, plan, chaos_broker, tmp_path, print)
    assert res.ok, (res.notes, res.lost_ids, res.duplicate_ids)
    assert res.sent > 0 and res.faults >= 1
    assert res.not_delivered == 0
    assert res.lost == 0, res.lost_ids
    assert res.answered == res.sent
    assert res.duplicate_terminals == 0
    assert res.executed_twice == 0
    assert res.unexpected_exits == 0, res.notes
    if scenario in (Scenario.APP_KILL, Scenario.DATADIR_WIPE, Scenario.BROKER):
        assert len(res.recovery_s) == res.faults  # the app came back after every fault
    if scenario is Scenario.OVERLOAD:
        assert res.gpu_lost == 0  # live GPUs were never declared lost
    if scenario is Scenario.SIGTERM:
        assert res.sigterm_exit_s is not None  # it exited before the 30 s limit
    if scenario is Scenario.POISON:
        g = res.groups["poison"]
        assert g["rounds"] == plan.poison_rounds and g["sent"] >= 60 * plan.poison_rounds
        assert g["answered"] > 0 and g["dead_lettered"] > 0  # both kinds of answer came
        assert g["unaccounted"] == 0 and g["duplicates"] == 0, res.notes
        assert res.max_decision_gap_s is not None  # decisions went on while it flowed
        assert not any("traceback" in n for n in res.notes), res.notes
    if scenario is Scenario.CONFIG:
        for group in ("removed-live", "removed-new"):
            g = res.groups[group]
            assert g["sent"] > 0 and g["with_reason"] == g["sent"], (group, res.notes)
        added = res.groups["added"]
        assert added["sent"] == plan.config_added == added["completed"], res.notes
        assert all(g["duplicates"] == 0 for g in res.groups.values())
    if scenario is Scenario.FORGERY:
        assert res.groups["control"]["allowed"] == res.groups["control"]["sent"] > 0
        assert res.groups["forgery"]["refused"] == res.groups["forgery"]["sent"] >= 5
