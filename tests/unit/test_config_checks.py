"""`triage config check` and triage/config/checks.py: valid configs that can never work
are flagged, one finding each, and the shipped configs are not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from triage.cli.common import ExitCode
from triage.cli.main import app
from triage.config import EXAMPLE_CONFIG, config_from_dict
from triage.config.checks import Finding, Severity, findings, runnable_problem

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _base() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    return data


def _found(data: dict[str, Any]) -> list[Finding]:
    return findings(config_from_dict(data))


def _errors(data: dict[str, Any]) -> list[str]:
    return [f.line() for f in _found(data) if f.severity is Severity.ERROR]


@pytest.mark.parametrize("path", [EXAMPLE_CONFIG, ROOT / "ops" / "compose" / "triage.yaml"])
def test_shipped_configs_have_no_errors(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    assert _errors(data) == []
    assert runnable_problem(config_from_dict(data)) is None


def test_partitions_the_app_cannot_run() -> None:
    data = _base()
    data["kafka"] = {**data.get("kafka", {}), "admission_partitions": 3}
    (line,) = _errors(data)
    assert line.startswith("error: kafka:") and "admission_partitions (3)" in line


def test_full_context_kv_above_every_gpu_budget_is_a_warning_with_the_limit() -> None:
    data = _base()
    model = data["models"][0]
    model["context_tokens"] = 10_000_000
    per_token = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * 2  # bf16
    found = [f for f in _found(data) if f.where.startswith("models[0:")]
    assert [f.severity for f in found] == [Severity.WARNING]
    pool = data["pools"][0]
    others = sum(m.get("reserved_kv_gib_per_gpu", 0) for m in data["models"][1:])
    fits = int((pool["kv_budget_gib"] - others) * 1024**3 // per_token)
    assert f"requests over {fits:,} tokens" in found[0].message


def test_a_model_nothing_fits_is_an_error() -> None:
    data = _base()
    data["models"][0].update(layers=1024, kv_heads=1024, head_dim=4096, dtype="fp32")
    assert any("not even a 2-token request fits" in e for e in _errors(data))


def test_a_pool_without_gpus() -> None:
    data = _base()
    data["pools"][0]["gpus"] = []
    errors = _errors(data)
    assert any("has no GPUs" in e for e in errors)
    assert any("every model it may call is in a pool without GPUs" in e for e in errors)


def test_a_tenant_that_may_call_no_model() -> None:
    data = _base()
    data["tenants"][0]["models"] = []
    assert any(e.startswith(f"error: tenants[0:{data['tenants'][0]['name']}]: may call no")
               for e in _errors(data))  # fmt: skip


def test_burst_plus_debt_below_the_smallest_request() -> None:
    data = _base()
    t = data["tenants"][1]
    t.update(burst_tokens=1.0, max_debt_tokens=0.5)
    (line,) = [e for e in _errors(data) if "tenants[1:" in e]
    assert "burst_tokens + max_debt_tokens (1.5) is below the smallest request (2 tokens)" in line
    t.update(max_debt_tokens=5.0)  # with debt it can pass
    assert not [e for e in _errors(data) if "tenants[1:" in e]
    data["policy"]["borrowing"] = False  # ... unless borrowing is off
    assert [e for e in _errors(data) if "tenants[1:" in e]


def test_burst_below_the_context_is_a_warning_unless_overage_is_allowed() -> None:
    data = _base()
    t = data["tenants"][0]
    t.update(burst_tokens=100.0, max_debt_tokens=0.0, allow_overage=False)
    warned = [f for f in _found(data) if f.where.startswith("tenants[0:")]
    assert [f.severity for f in warned] == [Severity.WARNING]
    assert "can never pass the quota" in warned[0].message
    t["allow_overage"] = True
    assert not [f for f in _found(data) if f.where.startswith("tenants[0:")]


def test_an_sla_no_gpu_can_meet() -> None:
    data = _base()
    data["tenants"][0]["sla_ms"] = 1
    assert any("SLA fit refuses every request" in e for e in _errors(data))
    data["policy"]["sla_fit"] = False
    assert not any("SLA fit" in e for e in _errors(data))


def test_admission_port_on_a_worker_port() -> None:
    data = _base()
    data["metrics"] = {"admission_port": 9311, "worker_port_base": 9310}
    (line,) = _errors(data)
    assert line.startswith("error: metrics.admission_port: 9311") and "gpu-1" in line


def _cli(tmp_path: Path, data: Any, *args: str) -> Any:
    p = tmp_path / "c.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return runner.invoke(app, ["config", "check", str(p), *args])


def test_cli_exit_codes_and_output(tmp_path: Path) -> None:
    ok = _cli(tmp_path, _base())
    assert ok.exit_code == ExitCode.OK and "valid" in ok.stdout
    warn_only = _base()
    warn_only["tenants"][0].update(burst_tokens=100.0, max_debt_tokens=0.0)
    res = _cli(tmp_path, warn_only)
    assert res.exit_code == ExitCode.OK and "warning: tenants[0:" in res.stderr
    assert _cli(tmp_path, warn_only, "--strict").exit_code == ExitCode.FAILED
    bad = _base()
    bad["metrics"] = {"admission_port": 9310, "worker_port_base": 9310}
    res = _cli(tmp_path, bad)
    assert res.exit_code == ExitCode.FAILED
    assert [ln for ln in res.stderr.splitlines() if ": error: " in ln], res.stderr
    res = _cli(tmp_path, bad, "--json")
    body = json.loads(res.stdout)
    assert body["valid"] is True and body["findings"][0]["severity"] == "error"
    invalid = _cli(tmp_path, "tenants: 3\n")
    assert invalid.exit_code == ExitCode.USAGE and "invalid configuration" in invalid.stderr
