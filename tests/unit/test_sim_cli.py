"""`triage sim` and `triage bench sim` from the command line (small runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from triage.cli.main import app

runner = CliRunner()


def _json(text: str) -> dict:  # type: ignore[type-arg]
    return json.loads(text[text.index("{"):])


def test_sim_scenario_json_and_report(tmp_path: Path) -> None:
    res = runner.invoke(app, [
        "sim", "adversarial", "--policies", "full,admit_all", "--scale", "0.03", "--seed", "2",
        "--json", "--report", str(tmp_path / "r"),
    ])
    assert res.exit_code == 0, res.output
    out = _json(res.stdout)
    assert out["policies"] == ["full", "admit_all"]
    assert out["scenario"]["seed"] == 2
    assert (tmp_path / "r" / "report.md").exists()


def test_sim_trace_with_columns(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:00:{i // 10:02d}.{i % 10}000000,{200 + i},{10 + i % 7}"
            for i in range(300)]
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    res = runner.invoke(app, [
        "sim", "--trace", str(csv), "--columns",
        "timestamp=TIMESTAMP,prompt=ContextTokens,output=GeneratedTokens,tenant=const:rag,"
        "model=const:llama-3.1-8b", "--speed", "10", "--policies", "full,reject_only", "--json",
    ])
    assert res.exit_code == 0, res.output
    out = _json(res.stdout)
    full = out["results"]["full"]
    assert full["arrivals"] == 300 and full["tenants"]["rag"]["requests"] == 300
    assert full["conserved"]


def test_sim_errors_are_one_line() -> None:
    res = runner.invoke(app, ["sim", "no-such-scenario"])
    assert res.exit_code == 2
    assert "no such scenario" in res.output
    res = runner.invoke(app, ["sim", "adversarial", "--policies", "fastest"])
    assert res.exit_code == 2 and "unknown policy" in res.output


def test_bench_sim_prints_one_json_object() -> None:
    res = runner.invoke(app, ["bench", "sim", "--json", "--requests", "3000", "--gpus", "2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["requests"] == 3000 and out["conserved"]
    assert out["requests_per_s"] > 0 and out["peak_rss_mb"] > 0


def test_bench_policies_times_each_policy_against_the_first() -> None:
    res = runner.invoke(app, ["bench", "policies", "tenants13@100", "--json", "--scale",
                              "0.01", "--repetitions", "2", "-p", "admit_all,full"])
    assert res.exit_code == 0, res.output
    out = _json(res.stdout)
    rows = out["policies"]
    assert list(rows) == ["admit_all", "full"] and out["repetitions"] == 2
    assert rows["admit_all"]["ratio"] == 1.0
    for row in rows.values():
        assert len(row["cpu_s_all"]) == 2 and row["cpu_s"] == min(row["cpu_s_all"]) > 0
    assert rows["full"]["requests"] == rows["admit_all"]["requests"] > 0  # same arrivals


def test_bench_policies_refuses_an_unknown_policy_before_running_any(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triage.bench import policy_time

    ran: list[str] = []
    monkeypatch.setattr(policy_time, "run_policy", lambda sc, p: ran.append(p))
    res = runner.invoke(app, ["bench", "policies", "tenants13", "-p", "full,bogus"])
    assert res.exit_code == 2 and "unknown policy 'bogus'" in res.output
    assert ran == []
