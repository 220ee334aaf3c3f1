"""`triage sim` refuses what it would otherwise ignore, checks before it runs, and runs
`-j 2` on the compiled build and the pure sources alike (`triage experiments` too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from triage.cli.main import app
from triage.sim.paths import builtin_scenarios

runner = CliRunner()
TRIAGE = [sys.executable, "-c", "from triage.cli.main import main; main()"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))


def _trace(path: Path, rows: int = 200, header: str = "TIMESTAMP,ContextTokens,GeneratedTokens",
           extra: str = "") -> Path:
    lines = [f"2023-11-16 18:00:{i // 10:02d}.{i % 10}000000,{200 + i},{10 + i % 7}{extra}"
             for i in range(rows)]
    path.write_text(header + "\n" + "\n".join(lines) + "\n")
    return path


def _json(text: str) -> dict:  # type: ignore[type-arg]
    return json.loads(text[text.index("{"):])


def test_options_a_scenario_would_ignore_are_refused() -> None:
    for opts in (["--speed", "3"], ["--limit", "10"], ["--tenant", "rag"]):
        res = runner.invoke(app, ["sim", "adversarial", *opts])
        assert res.exit_code == 2, res.output
        assert opts[0] in res.output and "only apply to --trace" in res.output
        assert "Traceback" not in res.output


def test_a_trace_needs_its_tenant_named(tmp_path: Path) -> None:
    csv = _trace(tmp_path / "t.csv")
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--policies", "admit_all"])
    assert res.exit_code == 2 and "--tenant" in res.output and "rag" in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--tenant", "nobody"])
    assert res.exit_code == 2 and "not a tenant" in res.output
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--tenant", "rag", "--speed", "10",
                              "--limit", "50", "--policies", "admit_all", "--json"])
    assert res.exit_code == 0, res.output
    r = _json(res.stdout)["results"]["admit_all"]
    assert r["arrivals"] == 50 and r["tenants"]["rag"]["requests"] == 50  # --limit honoured
    assert r["makespan_s"] < 20  # --speed honoured: 5 s of trace at 10x, plus the drain


def test_a_max_tokens_column_is_used(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    rows = [f"2023-11-16 18:00:{i:02d}.0,1000,20,{40000 if i % 5 == 0 else 64}"
            for i in range(50)]
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,max_tokens\n" + "\n".join(rows))
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--tenant", "rag",
                              "--policies", "admit_all", "--json"])
    assert res.exit_code == 0, res.output
    r = _json(res.stdout)["results"]["admit_all"]
    # the column is the client's ask: 1,000 + 40,000 is past the 8B's 32k context
    assert r["invalid"] == {"rag": {"context_overflow": 10}} and r["arrivals"] == 40
    assert "context_overflow" in res.stderr and "not simulated" in res.stderr
    # mapped explicitly to a derived ask instead, every row fits
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--tenant", "rag", "--columns",
                              "timestamp=TIMESTAMP,prompt=ContextTokens,output=GeneratedTokens,"
                              "max_tokens=output*2", "--policies", "admit_all", "--json"])
    r = _json(res.stdout)["results"]["admit_all"]
    assert res.exit_code == 0 and r["invalid"] == {} and r["arrivals"] == 50


def test_context_overflow_is_refused_counted_and_reported(tmp_path: Path) -> None:
    csv = tmp_path / "long.csv"
    rows = [f"2023-11-16 18:00:{i:02d}.0,{40000 if i % 4 == 0 else 500},20" for i in range(40)]
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--tenant", "rag",
                              "--policies", "admit_all", "--json"])
    assert res.exit_code == 0, res.output
    r = _json(res.stdout)["results"]["admit_all"]
    assert r["invalid"] == {"rag": {"context_overflow": 10}}
    assert r["arrivals"] == 30  # the live app refuses them before admission: not simulated
    assert "10 requests invalid" in res.stderr


def test_scenario_errors_are_one_line_before_any_progress_bar(tmp_path: Path) -> None:
    data = yaml.safe_load(builtin_scenarios()["adversarial"].read_text())
    data["duration_s"] = -5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["sim", str(bad)])
    assert res.exit_code == 2 and "duration_s" in res.output and "0%" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    # a trace mapping error (no such column) is found before the run starts
    csv = _trace(tmp_path / "t.csv")
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--tenant", "rag", "--columns",
                              "timestamp=TIMESTAMP,prompt=Nope,output=GeneratedTokens"])
    assert res.exit_code == 2 and "Nope" in res.output and "%" not in res.output
    for opts in (["--load", "0"], ["--scale", "-1"]):
        res = runner.invoke(app, ["sim", "adversarial", *opts])
        assert res.exit_code == 2 and opts[0] in res.output and "%" not in res.output
    assert runner.invoke(app, ["sim", "adversarial", "-j", "0"]).exit_code == 2


def _cli(args: list[str], pure: bool, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRIAGE_CACHE_DIR": str(cache), "COLUMNS": "200"}
    if pure:
        env["TRIAGE_PURE_CORE"] = "1"
    else:
        env.pop("TRIAGE_PURE_CORE", None)
    return subprocess.run([*TRIAGE, *args], env=env, capture_output=True, text=True,
                          timeout=600)


def test_sim_jobs_2_on_the_compiled_build_and_the_sources(tmp_path: Path) -> None:
    """-j 2 sends scenarios to worker processes and results back: both pickle, on both
    builds, and the figures do not depend on the number of jobs."""
    runs = {}
    for pure in (False, True):
        for name in ("tenants13@120", "two-services"):  # workloads, and a trace
            args = ["sim", name, "--scale", "0.02", "--policies", "full,admit_all", "--json"]
            par = _cli([*args, "-j", "2"], pure, tmp_path / "cache")
            assert par.returncode == 0, par.stderr[-2000:]
            assert "Traceback" not in par.stderr
            runs[(pure, name)] = json.loads(par.stdout)
    for name in ("tenants13@120", "two-services"):
        a, b = runs[(False, name)], runs[(True, name)]
        for p in ("full", "admit_all"):
            ra, rb = a["results"][p], b["results"][p]
            assert ra["arrivals"] == rb["arrivals"] > 0 and ra["conserved"]
            assert ra["overall"] == rb["overall"]  # compiled == pure, through the pool
        assert a["results"]["full"]["offered_load"] is not None
    one = _cli(["sim", "two-services", "--scale", "0.02", "--policies", "full,admit_all",
                "--json"], False, tmp_path / "cache")
    assert json.loads(one.stdout)["results"]["full"]["overall"] == (
        runs[(False, "two-services")]["results"]["full"]["overall"])


def test_experiments_jobs_2_on_the_compiled_build_and_the_sources(tmp_path: Path) -> None:
    for pure in (False, True):
        res = _cli(["experiments", "buffer", "--scale", "0.05", "-j", "2", "--json"], pure,
                   tmp_path / "cache")
        assert res.returncode in (0, 1), res.stderr[-2000:]
        assert "Traceback" not in res.stderr
        (out,) = json.loads(res.stdout)
        assert out["name"] == "buffer" and out["metrics"]


def test_load_option_and_named_variants_set_the_offered_load() -> None:
    for args, want in ((["tenants13@120"], 1.2), (["tenants13@120", "--load", "0.85"], 0.85),
                       (["two-services", "--load", "1.1"], 1.1)):
        res = runner.invoke(app, ["sim", *args, "--scale", "0.02", "--policies", "admit_all",
                                  "--json"])
        assert res.exit_code == 0, res.output
        out = _json(res.stdout)
        assert out["scenario"]["load"] == want
        assert out["results"]["admit_all"]["offered_load"] == pytest.approx(want, rel=0.03)
        assert out["results"]["admit_all"]["capacity_tokens_per_s"] > 0
