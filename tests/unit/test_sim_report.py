"""The report: figures, Markdown naming every policy, JSON that loads."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit._sim_factory import scenario
from triage.sim.compare import compare
from triage.sim.report import write_report


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
