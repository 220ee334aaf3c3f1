"""`triage sim`'s output: per-tenant and weight-normalized SLA, SLA by prompt length,
predictor error, `--json` a superset of the earlier fields, a report that ends with
the command that reproduces it."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from tests.unit._core_factory import config, model, tenant
from triage.cli.main import app
from triage.cli.sim_cmd import _tables
from triage.sim.arrivals import Poisson
from triage.sim.compare import compare
from triage.sim.dists import Const
from triage.sim.report import write_report
from triage.sim.scenario import Scenario
from triage.sim.workload import Workload

runner = CliRunner()
ARGS = ["sim", "seed-morning", "--policies", "full,admit_all", "--scale", "0.05", "--seed", "3"]

# what `--json` carried before these tables were added: still there
OLD_TABLE_KEYS = {
    "policy", "sla_attainment", "goodput_tokens_per_gpu_s", "acceptance", "timeout_rate",
    "preemption_rate", "gpu_utilization", "fairness_jain", "fairness_max_gap",
    "latency_p50_s", "latency_p99_s", "queue_wait_p99_s", "recompute_tokens", "requests",
    "wall_s",
}


def test_table_shows_per_tenant_and_weighted_sla(tmp_path: Path) -> None:
    res = runner.invoke(app, [*ARGS, "--report", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "SLA met per tenant" in out and "weighted" in out
    for name in ("rag", "embeddings", "batch"):
        assert name in out
    assert "w2, 4 s" in out  # rag's weight and SLA in its column header
    assert "SLA met by prompt length" in out and "<512" in out
    assert "predictor error" in out and "Jain backlogged" in out
    md = (tmp_path / "r" / "report.md").read_text()
    tail = md[md.index("## Reproduce"):]
    command = tail.split("```bash\n", 1)[1].split("\n", 1)[0]
    words = shlex.split(command)
    assert words[:3] == ["triage", "sim", "seed-morning"]
    assert {"--policies", "full,admit_all", "--seed", "3", "--scale", "0.05"} <= set(words)
    # the command reproduces the report's figures
    again = tmp_path / "again"
    words[words.index("--report") + 1] = str(again)
    res2 = runner.invoke(app, words[1:])
    assert res2.exit_code == 0, res2.output
    first = json.loads((tmp_path / "r" / "summary.json").read_text())
    second = json.loads((again / "summary.json").read_text())
    for a, b in zip(first["table"], second["table"], strict=True):
        assert {k: v for k, v in a.items() if k != "wall_s"} == {
            k: v for k, v in b.items() if k != "wall_s"}


def test_json_is_a_superset_of_the_earlier_output() -> None:
    res = runner.invoke(app, [*ARGS, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    for row in out["table"]:
        assert set(row) >= OLD_TABLE_KEYS
        assert {"sla_attainment_weighted", "fairness_jain_backlogged", "offered_load",
                "predictor_error_p99", "tenant_sla_attainment"} <= set(row)
    full = out["results"]["full"]["overall"]
    assert {"sla_by_prompt", "predictor_error", "retry_after_s", "backlogged_tenants"} <= set(full)


def test_many_tenants_turn_the_table_and_the_figure(tmp_path: Path) -> None:
    names = [f"t{i}" for i in range(7)]
    cfg = config(tenants=[tenant(t, sla_ms=4000, weight=1.0 + i % 2) for i, t in enumerate(names)],
                 models=[model("m8")], gpus=1)
    sc = Scenario(name="seven", config=cfg, duration_s=10.0, seed=1, sample_s=1.0, workloads=tuple(
        Workload(tenant=t, model="m8", arrivals=Poisson(2.0), prompt=Const(300), output=Const(20),
                 max_tokens=Const(40)) for t in names))
    cmp = compare(sc, ["full", "admit_all"])
    per = _tables(cmp)[1]
    console = Console(file=io.StringIO(), width=160)
    console.print(per)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert [c.header for c in per.columns] == ["tenant", "weight, SLA", "full", "admit_all"]
    assert per.row_count == 2 + len(names)  # all, weighted, then a row per tenant
    assert "t6" in text and "w2, 4 s" in text
    png = write_report(cmp, tmp_path / "r")["sla_goodput.png"]  # the grid form
    assert png.stat().st_size > 5_000
