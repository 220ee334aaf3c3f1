"""`triage schema`: registrable JSON Schema documents, and the compatibility policy of
docs/schema.md held by both the documents and the pydantic models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.unit.test_messages import SAMPLES
from triage.cli.main import app
from triage.topics.messages import (
    ALL_MESSAGES,
    JSON_SCHEMA_DIALECT,
    SCHEMA_VERSION,
    json_schema_document,
    json_schemas,
    schema_id,
)
from triage.topics.validation import parse_request

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"
runner = CliRunner()


def _validator(name: str) -> Draft202012Validator:
    doc = json_schema_document(name)
    Draft202012Validator.check_schema(doc)
    return Draft202012Validator(doc)


@pytest.mark.parametrize("name", sorted(ALL_MESSAGES))
def test_each_document_stands_alone_with_schema_and_id(name: str) -> None:
    doc = json_schema_document(name)
    assert doc["$schema"] == JSON_SCHEMA_DIALECT
    assert doc["$id"] == schema_id(name) == f"urn:triage:schema:{name}:v{SCHEMA_VERSION}"
    refs = [v for v in _walk(doc) if isinstance(v, str) and v.startswith("#/")]
    for ref in refs:  # every $ref resolves inside the document itself
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node[part]
    Draft202012Validator.check_schema(doc)


def _walk(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [
            x for v in node.values() for x in _walk(v)
        ]
    if isinstance(node, list):
        return [x for v in node for x in _walk(v)]
    return []


def test_ids_are_unique() -> None:
    ids = [d["$id"] for d in json_schemas().values()]
    assert len(ids) == len(set(ids)) == len(ALL_MESSAGES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_what_triage_writes_validates_against_the_document(name: str) -> None:
    wire = json.loads(SAMPLES[name].to_bytes())
    errors = list(_validator(name).iter_errors(wire))
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_unknown_fields_are_refused_by_the_document_and_the_model(name: str) -> None:
    wire = {**json.loads(SAMPLES[name].to_bytes()), "added_later": 1}
    assert not _validator(name).is_valid(wire)
    with pytest.raises(ValidationError, match="added_later"):
        ALL_MESSAGES[name].model_validate(wire)


def test_the_version_field_accepts_known_versions_and_refuses_newer_ones() -> None:
    cls = ALL_MESSAGES["InferenceRequest"]
    wire = json.loads(SAMPLES["InferenceRequest"].to_bytes())
    for version in range(1, SCHEMA_VERSION + 1):
        assert cls.model_validate({**wire, "schema_version": version}).schema_version == version
        assert _validator("InferenceRequest").is_valid({**wire, "schema_version": version})
    newer = {**wire, "schema_version": SCHEMA_VERSION + 1}
    assert not _validator("InferenceRequest").is_valid(newer)
    with pytest.raises(ValidationError, match="schema_version"):
        cls.model_validate(newer)
    # On the request topic: an `invalid` reply that names the field, not a silent drop.
    parsed = parse_request(json.dumps(newer))
    assert getattr(parsed, "detail", "").startswith("schema_version")
    assert "schema_version" not in SAMPLES["InferenceRequest"].to_bytes().decode()


def test_cli_prints_one_document_or_all_and_writes_files(tmp_path: Path) -> None:
    res = runner.invoke(app, ["schema", "InferenceRequest"])
    assert res.exit_code == 0
    assert json.loads(res.stdout) == json_schema_document("InferenceRequest")
    res = runner.invoke(app, ["schema"])
    assert res.exit_code == 0 and json.loads(res.stdout) == json_schemas()
    res = runner.invoke(app, ["schema", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0
    files = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert files == sorted(f"{n}.schema.json" for n in ALL_MESSAGES)
    doc = json.loads((tmp_path / "s" / "Reply.schema.json").read_text())
    assert doc["$id"] == schema_id("Reply")


def test_policy_is_written_down_as_the_code_has_it() -> None:
    text = DOC.read_text()
    assert f"`SCHEMA_VERSION` is {SCHEMA_VERSION}" in text
    assert JSON_SCHEMA_DIALECT in text and "urn:triage:schema:" in text
    assert "Unknown fields are refused" in text
    for name in ALL_MESSAGES:
        assert f"`{name}`" in text, name
