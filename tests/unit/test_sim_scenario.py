"""Scenario files, the shipped scenarios, and the headline claim at a reduced size."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from triage.sim.compare import compare
from triage.sim.errors import ScenarioError
from triage.sim.paths import builtin_scenarios
from triage.sim.scenario import load_scenario, merge_config, scenario_from_dict


def test_shipped_scenarios_load() -> None:
    names = set(builtin_scenarios())
    assert {"seed-morning", "multi-model", "adversarial", "azure-trace"} <= names
    for name in names:
        sc = load_scenario(name)
        assert (sc.workloads and sc.duration_s) or sc.traces
        assert sc.config.tenants


def test_scenario_file_relative_config_and_overrides(tmp_path: Path) -> None:
    data = {
        "name": "mine",
        "config": str(Path(__file__).resolve().parents[2] / "triage/examples/triage.yaml"),
        "config_overrides": {"tenants": [{"name": "rag", "sla_ms": 9000}]},
        "duration_s": 10,
        "workloads": [{
            "tenant": "rag", "arrivals": {"process": "poisson", "rate": 2},
            "prompt": {"dist": "lognormal", "median": 100}, "output": 10, "max_tokens": 20,
        }],
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    sc = load_scenario(str(path))
    rag = sc.config.tenant("rag")
    assert rag is not None and rag.sla_ms == 9000 and rag.weight == 2.0  # merged by name
    assert sc.workloads[0].model == "llama-3.1-8b"  # the tenant's first model
    arrivals = list(sc.arrivals())
    assert arrivals and all(a.t < 10 for a in arrivals)
    with pytest.raises(ScenarioError, match="unknown keys"):
        scenario_from_dict({**data, "colour": "blue"})
    with pytest.raises(ScenarioError, match="not a tenant"):
        scenario_from_dict({**data, "workloads": [{**data["workloads"][0], "tenant": "x"}]})
    with pytest.raises(ScenarioError, match="nothing would arrive"):
        scenario_from_dict({**data, "workloads": []})


def test_merge_config_merges_named_lists() -> None:
    base = {"a": {"b": 1, "c": 2}, "items": [{"name": "x", "v": 1}, {"name": "y", "v": 2}]}
    patch = {"a": {"c": 3}, "items": [{"name": "y", "v": 5}, {"name": "z", "v": 0}]}
    assert merge_config(base, patch) == {
        "a": {"b": 1, "c": 3},
        "items": [{"name": "x", "v": 1}, {"name": "y", "v": 5}, {"name": "z", "v": 0}],
    }


def test_azure_scenario_resolves_its_traces() -> None:
    sc = load_scenario("azure-trace")  # its traces ship in data/traces
    assert {t.path.name for t in sc.traces} == {"azure2023_conv.csv", "azure2023_code.csv"}
    first = next(iter(sc.arrivals()))
    assert first.t == 0.0 and first.tenant == "conv"  # conv starts 77 s before code
    assert sc.expected_duration() == pytest.approx(3513.0 / 1.5, rel=0.01)


def test_seed_scenario_full_policy_beats_admit_all() -> None:
    """At a tenth of its length the seed's morning still has its 9 AM spike, and the
    full policy keeps more requests inside their SLAs than an engine with no door."""
    sc = load_scenario("seed-morning").scaled(0.1)
    cmp = compare(sc, ["full", "admit_all"])
    sla = cmp.metric("sla_attainment")
    assert sla["full"] > sla["admit_all"]
    # the spike overflowed the unguarded engine, not the guarded one
    assert cmp["admit_all"].pools["shared"]["engine_preemptions"] > 0
    assert cmp["full"].pools["shared"]["engine_preemptions"] == 0
    emb = cmp.metric("sla_attainment", tenant="embeddings")
    assert emb["full"] > emb["admit_all"]
