"""The fault suite's plan, verdict and CLI surface (the runs themselves are
tests/faults/)."""

from __future__ import annotations

import json

from rich.console import Console
from typer.testing import CliRunner

from triage.chaos.plan import ALL, ChaosPlan, Scenario
from triage.chaos.report import ChaosReport, ScenarioResult, p99
from triage.cli.main import app


def test_full_plan_is_the_issue_sizes_and_reduced_is_small() -> None:
    full = ChaosPlan()
    assert full.scenarios == ALL and full.kills == 5 and full.duration_s == 180.0
    assert full.broker_down_s == 60.0 and full.overload_factor == 10.0
    assert full.overload_s == 60.0 and full.port == 9392
    assert {Scenario.POISON, Scenario.CONFIG, Scenario.FORGERY} <= set(full.scenarios)
    assert full.secure_port not in (full.port, full.port + 1)
    assert ChaosPlan.reduced().poison_rounds < full.poison_rounds
    small = ChaosPlan.reduced(scenarios=[Scenario.BROKER])
    assert small.scenarios == [Scenario.BROKER]
    assert small.duration_s < full.duration_s and small.broker_down_s < full.broker_down_s


def test_a_scenario_passes_only_with_nothing_lost_duplicated_run_twice_or_crashed() -> None:
    good = ScenarioResult("app-kill", faults=2, sent=10, answered=10)
    assert good.ok
    bad: list[dict[str, int]] = [{"lost": 1}, {"duplicate_terminals": 1},
                                 {"executed_twice": 1}, {"unexpected_exits": 1}, {"sent": 0}]
    for b in bad:
        r = ScenarioResult("app-kill", faults=2, **{"sent": 10, **b})  # type: ignore[arg-type]
        assert not r.ok, b
    assert not ScenarioResult("sigterm", faults=1, sent=5).ok  # did not exit in time
    assert ScenarioResult("sigterm", faults=1, sent=5, sigterm_exit_s=20.0).ok
    # a side group (poison entry, removed tenant's request, forgery) left unaccounted
    # or answered twice fails its scenario
    for g in ({"sent": 3, "unaccounted": 1}, {"sent": 3, "duplicates": 1}):
        assert not ScenarioResult("poison", faults=1, sent=5, groups={"poison": g}).ok
    assert ScenarioResult("poison", faults=1, sent=5,
                          groups={"poison": {"sent": 3, "unaccounted": 0}}).ok
    report = ChaosReport([good, ScenarioResult("broker", sent=3, lost=1)])
    assert not report.ok
    data = json.loads(json.dumps(report.to_dict()))
    assert [s["ok"] for s in data["scenarios"]] == [True, False]
    console = Console(width=220, record=True)
    console.print(report.table())
    assert "app-kill" in console.export_text()
    report.results.append(ScenarioResult("forgery", faults=8, sent=8, groups={
        "forgery": {"sent": 8, "refused": 8, "unaccounted": 0}}))
    console.print(report.table())
    assert "forgery: sent=8 refused=8" in console.export_text()


def test_p99() -> None:
    assert p99([]) is None and p99([2.0]) == 2.0
    assert abs((p99([float(i) for i in range(101)]) or 0) - 99.0) < 1e-9


def test_cli_refuses_bad_sizes_in_one_line() -> None:
    result = CliRunner().invoke(app, ["chaos", "--rate", "-1"])
    assert result.exit_code == 2
    assert "invalid chaos settings" in result.output and "Traceback" not in result.output
    assert "fault suite" in CliRunner().invoke(app, ["chaos", "--help"]).output
