"""Configuration: the example loads, and every bad field is named in the error."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from triage.config import EXAMPLE_CONFIG, ConfigError, TriageConfig, config_from_dict, load_config

EXAMPLE: dict[str, Any] = yaml.safe_load(EXAMPLE_CONFIG.read_text())


def _bad(mutate: Any) -> str:
    data = copy.deepcopy(EXAMPLE)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source="test.yaml")
    return str(info.value)


def test_example_describes_the_seed(triage_config: TriageConfig) -> None:
    assert [t.name for t in triage_config.tenants] == ["rag", "embeddings", "batch"]
    assert [m.name for m in triage_config.models] == ["llama-3.1-8b", "llama-3.1-70b"]
    assert triage_config.all_gpus() == ["gpu-0", "gpu-1"]
    assert triage_config.kafka.bootstrap_servers == "127.0.0.1:9092"
    rag = triage_config.tenant("rag")
    assert rag is not None and rag.max_debt_tokens > 0  # bursty: borrows
    batch = triage_config.tenant("batch")
    assert batch is not None and batch.allow_overage
    emb = triage_config.tenant("embeddings")
    assert emb is not None and emb.reserved_kv_share > 0


def test_kv_bytes_per_token_from_geometry(triage_config: TriageConfig) -> None:
    small, big = triage_config.models
    assert small.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB per token
    assert big.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2


def test_config_round_trips_through_yaml(tmp_path: Path, triage_config: TriageConfig) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(triage_config.model_dump(mode="json")))
    assert load_config(path) == triage_config


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["tenants"][1].update(burst_tokens=-5), "tenants[1:embeddings].burst_tokens"),
        (lambda d: d["tenants"][0].update(bogus=1), "tenants[0:rag].bogus"),
        (lambda d: d["tenants"][2].update(weight=math.nan), "tenants[2:batch].weight"),
        (lambda d: d["tenants"][0].update(rate_tokens_per_s=math.inf), "rate_tokens_per_s"),
        (lambda d: d["tenants"][0].update(name="Has Caps"), "tenants[0:Has Caps].name"),
        (lambda d: d["tenants"][0].update(queue_max=1.5), "tenants[0:rag].queue_max"),
        (lambda d: d["models"][0].update(layers=0), "models[0:llama-3.1-8b].layers"),
        (lambda d: d["models"][1].update(dtype="fp12"), "models[1:llama-3.1-70b].dtype"),
        (lambda d: d["models"][0].update(pool="nope"), "models[0].pool: unknown pool 'nope'"),
        (lambda d: d["pools"][0].update(gpu_type="B300"), "pools[0].gpu_type"),
        (lambda d: d["pools"][0].update(kv_budget_gib=500), "pools[0].kv_budget_gib"),
        (lambda d: d["hysteresis"].update(low=0.9, high=0.5), "hysteresis.low"),
        (lambda d: d["tenants"].append(dict(d["tenants"][0])), "duplicate name 'rag'"),
        (lambda d: d["tenants"][0].update(models=["gpt-17"]), "tenants[0].models"),
        (lambda d: d["tenants"][1].update(reserved_kv_share=0.95), "reserved_kv_share"),
        (lambda d: d["kafka"].update(request_partitions=0), "kafka.request_partitions"),
        (lambda d: d["metrics"].update(admission_port=70000), "metrics.admission_port"),
        (lambda d: d.pop("tenants"), "tenants: Field required"),
    ],
)
def test_bad_config_names_the_field(mutate: Any, needle: str) -> None:
    message = _bad(mutate)
    assert message.startswith("test.yaml: ")
    assert needle in message


_POSITIVE_TENANT_FIELDS = ["rate_tokens_per_s", "burst_tokens", "weight", "max_requests_per_s"]


@given(
    index=st.integers(0, 2),
    field=st.sampled_from(_POSITIVE_TENANT_FIELDS),
    value=st.floats(max_value=0.0) | st.just(math.nan),
)
def test_any_non_positive_tenant_rate_names_tenant_and_field(
    index: int, field: str, value: float
) -> None:
    name = EXAMPLE["tenants"][index]["name"]
    message = _bad(lambda d: d["tenants"][index].update({field: value}))
    assert f"tenants[{index}:{name}].{field}" in message


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(scalar)
