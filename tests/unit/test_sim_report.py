"""The report: figures, Markdown naming every policy, JSON that loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.unit._sim_factory import scenario, sim_config
from triage.config import config_from_dict
from triage.sim.compare import compare
from triage.sim.plots import zoomed_floor
from triage.sim.plots_time import clock
from triage.sim.report import write_report
from triage.sim.scenario import Scenario, TraceSpec, load_scenario
from triage.sim.trace import parse_columns


def test_report_writes_every_file(tmp_path: Path) -> None:
    policies = ["full", "admit_all", "full+variance_buffer=1.3"]
    cmp = compare(scenario(duration_s=30.0), policies)
    written = write_report(cmp, tmp_path / "out")
    for name in ("latency_cdf.png", "timeline.png", "sla_goodput.png", "share.png"):
        png = written[name]
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 5_000
    md = written["report.md"].read_text()
    for p in policies:
        assert f"| {p} |" in md
    assert "![" in md and "latency_cdf.png" in md
    summary = json.loads(written["summary.json"].read_text())
    assert summary["policies"] == policies
    assert summary["results"]["full"]["tenants"]["a"]["requests"] > 0
    assert {row["policy"] for row in summary["table"]} == set(policies)
    series = json.loads(written["series.json"].read_text())
    assert set(series) == set(policies)


def test_report_has_the_new_figures_tables_and_reproduces(tmp_path: Path) -> None:
    sc = scenario(duration_s=30.0, rate_a=10.0, rate_b=5.0)
    cmp = compare(sc, ["full", "admit_all"])
    cmp["full"].overall["offered_load"] = 0.87  # what the capacity measurement sets
    written = write_report(cmp, tmp_path / "out", command="triage sim small --seed 1")
    for name in ("refusals.png", "retry_hints.png", "sla_over_time.png", "config.yaml"):
        assert written[name].exists() and written[name].stat().st_size > 1_000
    md = written["report.md"].read_text()
    # per-tenant and weight-normalized SLA, in a table with every policy
    assert "## SLA attainment per tenant" in md
    assert "| policy | all requests | weight-normalized | a (weight 2, SLA 4 s) | " in md
    for p in ("full", "admit_all"):
        r = cmp[p]
        row = (f"| {p} | {100 * r.overall['sla_attainment']:.1f}% | "
               f"{100 * r.overall['sla_attainment_weighted']:.1f}% | "
               f"{100 * r.tenants['a']['sla_attainment']:.1f}% | "
               f"{100 * r.tenants['b']['sla_attainment']:.1f}% |")
        assert row in md
    assert "SLA met (completed only)" in md
    assert "## SLA attainment by prompt length (tokens)" in md and "| policy | <512 (" in md
    assert "## Predictor error (actual / predicted execution time)" in md
    assert "## Refusals and retry hints" in md
    assert "- offered load: 87.0% of capacity" in md
    # it ends with the command and the configuration
    tail = md[md.index("## Reproduce"):]
    assert "triage sim small --seed 1" in tail and "```yaml" in tail
    back = config_from_dict(yaml.safe_load(written["config.yaml"].read_text()))
    assert back == sc.config
    summary = json.loads(written["summary.json"].read_text())
    full = next(row for row in summary["table"] if row["policy"] == "full")
    assert full["offered_load"] == 0.87 and "sla_attainment_weighted" in full


def test_clock_reads_the_scenario_time_of_day_and_its_spike() -> None:
    ck = clock(load_scenario("seed-morning"), 3600.0)
    assert ck.time_of_day and ck.origin == 8.5
    assert ck.spikes == [(1800.0, 2700.0, "batch spike")]  # 9:00 to 9:15
    assert ck.x(1800.0) == pytest.approx(9.0)
    scaled = clock(load_scenario("seed-morning").scaled(0.2), 720.0)
    assert scaled.x(360.0) == pytest.approx(9.0)  # the compressed day keeps its clock
    plain = clock(scenario(duration_s=60.0), 60.0)
    assert not plain.time_of_day and plain.label == "seconds from start" and not plain.spikes
    assert clock(scenario(duration_s=3600.0), 3600.0).label == "minutes from start"


def test_clock_of_a_trace_is_its_own_time_of_day(tmp_path: Path) -> None:
    def trace(name: str, stamps: list[str]) -> Scenario:
        csv = tmp_path / f"{name}.csv"
        rows = [f"{ts},{200 + i},{10 + i}" for i, ts in enumerate(stamps)]
        csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
        cols = parse_columns("timestamp=TIMESTAMP,prompt=ContextTokens,output=GeneratedTokens,"
                             "tenant=const:a,model=const:m8")
        return Scenario(name=name, config=sim_config(),
                        traces=(TraceSpec(csv, cols, speed=2.0),))

    wall = clock(trace("wall", ["2023-11-16 18:30:00.0", "2023-11-16 18:40:00.0"]), 300.0)
    assert wall.time_of_day and wall.origin == pytest.approx(18.5)
    assert wall.x(900.0) == pytest.approx(19.0)  # 900 s at 2x: half an hour of trace time
    assert "2x" in wall.label
    rel = clock(trace("rel", ["0.5", "30.0"]), 15.0)
    assert not rel.time_of_day and rel.label == "seconds from start"


def test_zoomed_axis_only_where_zero_hides_differences() -> None:
    assert zoomed_floor([9_000.0, 9_400.0]) > 0  # 4% apart: a zero base hides it
    assert zoomed_floor([9_000.0, 9_400.0]) < 9_000.0
    assert zoomed_floor([1_000.0, 9_400.0]) == 0.0


def test_the_cli_starts_without_matplotlib() -> None:
    """Every `triage` process (the admission app, a worker after kill -9) imports the CLI;
    the plotting modules load only when a report is drawn."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c",
         "import sys, triage.cli.main; print('matplotlib' in sys.modules)"],
        capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
