"""ops/helm/triage, checked as data: the chart renders (a small renderer of its template
subset, or helm itself where installed) into objects that run triage's real commands
with real options, probe real ports, scale on a metric triage exports, and alert on
series triage registers with the labels they have."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import typer.main
import yaml

import triage.cli.main as cli_main
from tests.unit._helm_render import documents, render_chart
from tests.unit.test_ops_docs import BY_RE, MATCHER_RE, NAME_RE, SELECTOR_RE, SERIES
from triage.config import EXAMPLE_CONFIG, load_config
from triage.config.checks import Severity, findings
from triage.config.load import config_from_dict

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "ops" / "helm" / "triage"
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
ALERTS: dict[str, Any] = yaml.safe_load((CHART / "files" / "alerts.yml").read_text())


def _values(**enable: bool) -> dict[str, Any]:
    v = copy.deepcopy(VALUES)
    v["keda"]["enabled"] = enable.get("keda", False)
    v["prometheusRule"]["enabled"] = enable.get("rules", False)
    v["admission"]["persistence"]["enabled"] = enable.get("persistence", False)
    v["gateway"]["enabled"] = enable.get("gateway", True)
    return v


ALL_ON = _values(keda=True, rules=True, persistence=True)


def _objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    return documents(render_chart(CHART, values))


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]


# --------------------------------------------------------------------------- rendering


def test_chart_metadata_matches_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2" and chart["name"] == "triage"
    assert chart["appVersion"] == project["version"]


def test_defaults_and_everything_on_render_the_expected_objects() -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in _objects(VALUES)}
    assert base == {
        ("ConfigMap", "rel-triage-config"),
        ("Deployment", "rel-triage-admission"), ("Service", "rel-triage-admission"),
        ("StatefulSet", "rel-triage-worker-shared"), ("Service", "rel-triage-worker-shared"),
        ("Deployment", "rel-triage-gateway"), ("Service", "rel-triage-gateway"),
    }  # fmt: skip
    full = {(o["kind"], o["metadata"]["name"]) for o in _objects(ALL_ON)}
    assert full - base == {
        ("ScaledObject", "rel-triage-worker-shared"), ("PrometheusRule", "rel-triage"),
        ("PersistentVolumeClaim", "rel-triage-admission-data"),
    }  # fmt: skip
    no_gateway = {(o["kind"], o["metadata"]["name"]) for o in _objects(_values(gateway=False))}
    assert not any("gateway" in name for _, name in no_gateway)


def test_the_mounted_config_is_the_values_config_and_is_sound() -> None:
    (cm,) = _by_kind(_objects(VALUES), "ConfigMap")
    mounted = yaml.safe_load(cm["data"]["triage.yaml"])
    assert mounted == VALUES["config"]
    cfg = config_from_dict(mounted, source="values.yaml config")
    assert not [f for f in findings(cfg) if f.severity is Severity.ERROR]
    example = load_config(EXAMPLE_CONFIG)
    assert cfg.tenants == example.tenants and cfg.models == example.models
    assert cfg.metrics.host == "0.0.0.0", "metrics must listen beyond the pod's loopback"


def test_every_worker_pod_has_a_gpu_id_in_its_pool() -> None:
    cfg = config_from_dict(VALUES["config"])
    for w in VALUES["workers"]:
        pool = cfg.pool(w["pool"])
        assert 1 <= w["replicas"] <= w["maxReplicas"]
        wanted = [f"{w['gpuPrefix']}{i}" for i in range(w["maxReplicas"])]
        assert set(wanted) <= set(pool.gpus), f"pool {pool.name}: needs {wanted}"


# --------------------------------------------------------------------------- workloads


def _options(path: list[str]) -> set[str]:
    cmd: Any = typer.main.get_command(cli_main.app)
    for name in path:
        cmd = cmd.commands[name]
    return {o for p in cmd.params if p.param_type_name == "option" for o in p.opts}


def _argv(container: dict[str, Any]) -> list[str]:
    if container.get("command", [])[:2] == ["/bin/sh", "-c"]:
        line = container["args"][0]
        assert line.startswith("exec triage ")
        return line.removeprefix("exec triage ").split()
    return [str(a) for a in container["args"]]


def test_containers_run_real_commands_with_real_options() -> None:
    seen = set()
    for o in _workloads(_objects(ALL_ON)):
        for c in o["spec"]["template"]["spec"]["containers"]:
            argv = _argv(c)
            command = argv[0]
            seen.add(command)
            if command == "gateway" and "gateway" not in _options_root():
                continue  # built on another branch; checked once it is here
            known = _options([command])
            for word in argv[1:]:
                if word.startswith("--"):
                    assert word in known, f"triage {command} has no option {word}"
            assert "/etc/triage/triage.yaml" in argv
    assert {"admission", "worker", "gateway"} <= seen


def _options_root() -> set[str]:
    return set(typer.main.get_command(cli_main.app).commands)  # type: ignore[attr-defined]


def test_gateway_command_is_registered() -> None:
    assert "gateway" in _options_root()
    assert {"--config", "--port"} <= _options(["gateway"])


def test_every_container_is_probed_on_a_port_it_declares() -> None:
    cfg = config_from_dict(VALUES["config"])
    for o in _workloads(_objects(ALL_ON)):
        for c in o["spec"]["template"]["spec"]["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            for probe in ("livenessProbe", "readinessProbe"):
                get = c[probe]["httpGet"]
                assert get["port"] in ports, (c["name"], probe)
            if c["name"] == "admission":
                assert ports["metrics"] == cfg.metrics.admission_port
                assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
                assert c["livenessProbe"]["httpGet"]["path"] == "/live"
                assert c["startupProbe"]["failureThreshold"] * 5 >= 300
            if c["name"] == "worker":
                assert f"--metrics-port {ports['metrics']}" in c["args"][0]
            if c["name"] == "gateway":
                assert str(ports["http"]) in _argv(c)


def test_selectors_match_their_pods_and_services_find_them() -> None:
    objs = _objects(ALL_ON)
    pods = []
    for o in _workloads(objs):
        labels = o["spec"]["template"]["metadata"]["labels"]
        assert o["spec"]["selector"]["matchLabels"].items() <= labels.items(), o["metadata"]
        pods.append(labels)
    for s in _by_kind(objs, "Service"):
        assert any(s["spec"]["selector"].items() <= p.items() for p in pods), s["metadata"]
    (admission,) = [o for o in objs if o["metadata"]["name"] == "rel-triage-admission"
                    and o["kind"] == "Deployment"]  # fmt: skip
    assert admission["spec"]["replicas"] == 1
    assert admission["spec"]["strategy"]["type"] == "Recreate"
    configmaps = {o["metadata"]["name"] for o in _by_kind(objs, "ConfigMap")}
    for o in _workloads(objs):
        for v in o["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps
    for st in _by_kind(objs, "StatefulSet"):
        assert st["spec"]["serviceName"] in {s["metadata"]["name"] for s in _by_kind(objs,
                                                                                     "Service")}


# --------------------------------------------------------------------------- PromQL


def _check_expr(where: str, expr: str) -> None:
    names = NAME_RE.findall(expr)
    assert names, f"{where}: queries no triage metric"
    for name in names:
        assert name in SERIES, f"{where}: {name} is not exported by triage"
    for m in NAME_RE.finditer(expr):
        metric = SERIES[m.group(1)]
        rated = re.search(r"\b(rate|irate|increase)\(\s*$", expr[: m.start()])
        if metric.type == "gauge":
            assert not rated, f"{where}: rate() of the gauge {m.group(1)}"
        else:
            assert rated, f"{where}: {m.group(1)} is a counter; rate() it"
    for series, matchers in SELECTOR_RE.findall(expr):
        for label, _, _ in MATCHER_RE.findall(matchers):
            assert label in SERIES[series].labels, f"{where}: {series} has no label {label}"
    for group in BY_RE.findall(expr):
        for label in (x.strip() for x in group.split(",") if x.strip()):
            assert all(label in SERIES[n].labels for n in names), f"{where}: by ({label})"


def test_alert_rules_query_registered_series_with_their_labels() -> None:
    rules = [r for g in ALERTS["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules}
    assert {"TriageSlaViolationRateHigh", "TriageQueueTimeoutsHigh",
            "TriagePreemptionRateHigh"} <= set(alerts)  # fmt: skip
    for r in rules:
        _check_expr(r["alert"], r["expr"])
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]
    assert "triage_sla_violations_total" in alerts["TriageSlaViolationRateHigh"]["expr"]
    assert "triage_queue_timeouts_total" in alerts["TriageQueueTimeoutsHigh"]["expr"]
    preempt = alerts["TriagePreemptionRateHigh"]["expr"]
    assert "triage_preemption_rate" in preempt and preempt.rstrip().endswith("> 0.02")


def test_prometheus_rule_carries_the_alert_file() -> None:
    (rule,) = _by_kind(_objects(ALL_ON), "PrometheusRule")
    assert rule["spec"] == ALERTS
    values = _values(rules=True)
    values["prometheusRule"]["labels"] = {"release": "prometheus"}
    (rule,) = _by_kind(_objects(values), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"


def test_keda_scales_each_pool_on_the_autoscale_signal() -> None:
    objs = _objects(ALL_ON)
    scaled = _by_kind(objs, "ScaledObject")
    sets = {o["metadata"]["name"]: o for o in _by_kind(objs, "StatefulSet")}
    assert len(scaled) == len(VALUES["workers"]) == len(sets)
    for so, w in zip(scaled, VALUES["workers"], strict=True):
        target = so["spec"]["scaleTargetRef"]
        assert target["kind"] == "StatefulSet" and target["name"] in sets
        assert so["spec"]["minReplicaCount"] == w["replicas"]
        assert so["spec"]["maxReplicaCount"] == w["maxReplicas"]
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        query = trigger["metadata"]["query"]
        _check_expr("keda", query)
        assert "triage_autoscale_signal" in query and f'pool="{w["pool"]}"' in query


# --------------------------------------------------------------------------- helm itself


def _helm() -> str:
    """`make install` builds helm into the venv (Makefile: HELM); one on PATH also does."""
    local = Path(sys.executable).parent / "helm"
    found = str(local) if local.exists() else shutil.which("helm")
    assert found, "helm is missing: run `make install` (it builds helm with go)"
    return found


def test_helm_renders_what_the_small_renderer_renders(tmp_path: Path) -> None:
    helm = _helm()
    lint = subprocess.run([helm, "lint", str(CHART)], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    on = tmp_path / "on.yaml"
    on.write_text(yaml.safe_dump(ALL_ON))
    out = subprocess.run([helm, "template", "rel", str(CHART), "-f", str(on)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    theirs = [d for d in yaml.safe_load_all(out) if d]
    ours = _objects(ALL_ON)

    def norm(objs: list[dict[str, Any]]) -> list[Any]:
        """Go's and PyYAML's YAML differ in form (1 vs 1.0): compare the mounted config
        parsed, and not the checksum of its text."""
        text = yaml.safe_dump(sorted(objs, key=lambda o: (o["kind"], o["metadata"]["name"])))
        out: list[Any] = yaml.safe_load(re.sub(r"checksum/config: \S+", "checksum/config: x",
                                               text))  # fmt: skip
        for o in out:
            if o["kind"] == "ConfigMap":  # as triage loads it (Go writes 2e-05, a YAML 1.1 str)
                mounted = yaml.safe_load(o["data"]["triage.yaml"])
                o["data"]["triage.yaml"] = config_from_dict(mounted).model_dump()
        return out

    assert norm(theirs) == norm(ours)
