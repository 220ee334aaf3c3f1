"""Load a TriageConfig from YAML, with errors that name the offending field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from triage.config.errors import ConfigError
from triage.config.models import TriageConfig

EXAMPLE_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "triage.yaml"


def _field_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Turn a pydantic location into `tenants[2].burst_tokens` (with the tenant's name)."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(node, list) and 0 <= item < len(node):
                node = node[item]
                if isinstance(node, dict) and "name" in node:
                    label = f"[{item}:{node['name']}]"
            parts.append(label)
        else:
            parts.append(("." if parts else "") + str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "<root>"


def _describe(err: Any, data: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:
        return f"  {msg}"
    got = err.get("input")
    shown = "" if err["type"] == "missing" or isinstance(got, dict | list) else f" (got {got!r})"
    return f"  {_field_path(tuple(err['loc']), data)}: {msg}{shown}"


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line: where, then what (its own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem is None:
        return " ".join(str(exc).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def config_from_dict(data: Any, source: str = "<dict>") -> TriageConfig:
    """Validate a parsed mapping; raise ConfigError naming each bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return TriageConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(err, data) for err in exc.errors()]
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines)) from None


def load_config(path: str | Path | None = None) -> TriageConfig:
    """Load the YAML file at `path`, or the shipped example when None."""
    p = Path(path) if path is not None else EXAMPLE_CONFIG
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {yaml_error_line(exc)}") from None
    return config_from_dict(data, source=str(p))


def tenant_change(running: TriageConfig, fresh: TriageConfig) -> TriageConfig | None:
    """The config a running app adopts when the file's tenant list changed: `running`
    with the tenants added in `fresh` and without those removed from it (a kept tenant
    keeps its running definition: other edits need a restart). None: no tenant came or
    went. Validated again, so derived lookups are fresh and cross-checks hold."""
    names = {t.name for t in fresh.tenants}
    known = {t.name for t in running.tenants}
    if names == known:
        return None
    tenants = [t for t in running.tenants if t.name in names]
    tenants += [t for t in fresh.tenants if t.name not in known]
    if not tenants:
        raise ConfigError("tenants: the new configuration has none")
    data = running.model_dump(mode="json")
    data["tenants"] = [t.model_dump(mode="json") for t in tenants]
    return config_from_dict(data, "<reloaded config>")
