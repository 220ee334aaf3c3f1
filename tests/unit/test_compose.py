"""docker-compose.yml (and its secured variant, docker-compose.secure.yml) agrees with the
CLI, the example config, the ACL table, Prometheus and Grafana.

There is no Docker engine here, so the file is checked as data: every command
names a real `triage` command with real options, every port and GPU id is the
one the config says, and every file it mounts exists.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

import triage.cli.main as cli_main
from triage.config import EXAMPLE_CONFIG, TriageConfig, load_config
from triage.kafka.acls import ADMIN, APP, WORKER, principals
from triage.kafka.local import KAFKA_VERSION
from triage.kafka.secure import CredentialStore, broker_security_properties

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
CONFIG_MOUNT = "/etc/triage/triage.yaml"
TRIAGE_SERVICES = ["topics", "admission", "worker-gpu-0", "worker-gpu-1"]


def _published(service: str) -> dict[int, int]:
    """container port -> host port, from '127.0.0.1:HOST:CONTAINER' entries."""
    out: dict[int, int] = {}
    for entry in SERVICES[service].get("ports", []):
        *host, container = str(entry).split(":")
        out[int(container)] = int(host[-1])
    return out


def _mounts(service: str) -> dict[str, str]:
    """container path -> host path (relative to the repo) for bind mounts."""
    out: dict[str, str] = {}
    for entry in SERVICES[service].get("volumes", []):
        host, container, *_ = str(entry).split(":")
        out[container] = host
    return out


def _compose_config() -> TriageConfig:
    host = _mounts("admission")[CONFIG_MOUNT]
    return load_config(ROOT / host)


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_services_are_the_stack() -> None:
    assert set(SERVICES) == {"kafka", *TRIAGE_SERVICES, "prometheus", "grafana"}


def test_kafka_image_is_our_pinned_version_in_kraft_mode() -> None:
    kafka = SERVICES["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1


def test_host_listener_matches_the_example_bootstrap(triage_config: TriageConfig) -> None:
    host, port = triage_config.kafka.bootstrap_servers.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert _published("kafka")[int(port)] == int(port)
    advertised = SERVICES["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"EXTERNAL://127.0.0.1:{port}" in advertised.split(",")


def test_containers_reach_kafka_on_its_internal_listener() -> None:
    advertised = SERVICES["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    internal = next(a for a in advertised if a.startswith("INTERNAL://"))
    assert _compose_config().kafka.bootstrap_servers == internal.removeprefix("INTERNAL://")


def test_compose_config_is_the_example_with_in_network_addresses() -> None:
    example = load_config(EXAMPLE_CONFIG).model_dump(mode="json")
    compose = _compose_config().model_dump(mode="json")
    assert compose["metrics"]["host"] == "0.0.0.0"  # scrapeable from the prometheus container
    for section, key in [("kafka", "bootstrap_servers"), ("metrics", "host"),
                         ("admission", "datadir")]:  # fmt: skip
        example[section].pop(key)
        compose[section].pop(key)
    assert compose == example


def _resolve(args: list[str]) -> tuple[list[str], Any]:
    """Walk `triage a b ...` down the command tree; None when the command is not registered.

    Typer vendors its own click, so groups are recognised by their `commands` mapping.
    """
    cmd: Any = typer.main.get_command(cli_main.app)
    path: list[str] = []
    rest = list(args)
    while hasattr(cmd, "commands") and rest and not rest[0].startswith("-"):
        sub = cmd.commands.get(rest[0])
        if sub is None:
            return [*path, rest[0]], None
        path.append(rest.pop(0))
        cmd = sub
    return path, cmd


@pytest.mark.parametrize("service", TRIAGE_SERVICES)
def test_triage_commands_exist_with_their_options(service: str) -> None:
    spec = SERVICES[service]
    assert spec["build"] == "."
    assert (ROOT / "Dockerfile").is_file()
    args = [str(a) for a in spec["command"]]
    assert args[0] == "triage"
    path, cmd = _resolve(args[1:])
    assert _option(args, "--config") == CONFIG_MOUNT
    assert _mounts(service)[CONFIG_MOUNT] == "./ops/compose/triage.yaml"
    if cmd is None:
        # Not implemented yet: the name must at least be registered by main.py.
        module = getattr(cli_main, f"{path[0]}_cmd", None)
        assert module is not None, f"`triage {' '.join(path)}` is not a triage command"
        assert hasattr(module, "register") or hasattr(module, "app")
        return
    known = {opt for p in cmd.params for opt in p.opts}
    used = {a for a in args if a.startswith("--")}
    assert used <= known, f"`triage {' '.join(path)}` has no {sorted(used - known)}"


def test_one_sim_worker_per_configured_gpu_on_its_metrics_port(
    triage_config: TriageConfig,
) -> None:
    gpus = triage_config.all_gpus()
    workers = {s: [str(a) for a in SERVICES[s]["command"]] for s in SERVICES if "worker" in s}
    assert sorted(_option(a, "--gpu") for a in workers.values()) == sorted(gpus)
    for service, args in workers.items():
        gpu = _option(args, "--gpu")
        assert service == f"worker-{gpu}"
        assert _option(args, "--backend") == "sim"
        port = triage_config.metrics.worker_port_base + gpus.index(gpu)
        assert _published(service) == {port: port}


def test_admission_publishes_its_metrics_port(triage_config: TriageConfig) -> None:
    port = triage_config.metrics.admission_port
    assert _published("admission") == {port: port}


def test_prometheus_scrapes_admission_and_every_worker(triage_config: TriageConfig) -> None:
    mounts = _mounts("prometheus")
    prom = yaml.safe_load((ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    targets = {
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    gpus = triage_config.all_gpus()
    expected = {f"admission:{triage_config.metrics.admission_port}"} | {
        f"worker-{g}:{triage_config.metrics.worker_port_base + i}" for i, g in enumerate(gpus)
    }
    assert targets == expected
    for target in targets:
        assert target.split(":")[0] in SERVICES


def test_grafana_is_provisioned_from_ops() -> None:
    mounts = _mounts("grafana")
    prov = ROOT / mounts["/etc/grafana/provisioning"]
    dashboards = ROOT / mounts["/var/lib/grafana/dashboards"]
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus"
    assert ds["url"] == f"http://prometheus:{_published('prometheus')[9090]}"
    provider = yaml.safe_load((prov / "dashboards" / "triage.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    board = json.loads((dashboards / "triage.json").read_text())
    assert board["uid"] and board["title"] and board["panels"]
    uids = {p["datasource"]["uid"] for p in board["panels"] if "datasource" in p}
    assert uids <= {ds["uid"]}


def test_every_bind_mount_exists() -> None:
    for service in SERVICES:
        for host in _mounts(service).values():
            if host.startswith("."):
                assert (ROOT / host).exists(), f"{service} mounts missing {host}"


# --------------------------------------------------------------------------- secured variant

SECURE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text())
SECURE_SERVICES: dict[str, dict[str, Any]] = SECURE["services"]
SECRETS_DIR_VAR = "${TRIAGE_SECRETS_DIR?"


def _secure_mounts(service: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in SECURE_SERVICES[service].get("volumes", []):
        host, container, *_ = str(entry).split(":")
        out[container] = host
    return out


def _secure_config(service: str) -> TriageConfig:
    args = [str(a) for a in SECURE_SERVICES[service]["command"]]
    return load_config(ROOT / _secure_mounts(service)[_option(args, "--config")])


def test_secure_variant_overrides_the_stack_and_adds_the_acl_job() -> None:
    assert set(SECURE_SERVICES) == {"kafka", "kafka-acls", *TRIAGE_SERVICES}
    acls = SECURE_SERVICES["kafka-acls"]
    assert acls["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    assert SECURE_SERVICES["topics"]["depends_on"] == {
        "kafka-acls": {"condition": "service_completed_successfully"}}


@pytest.mark.parametrize("service", ["kafka-acls", *TRIAGE_SERVICES])
def test_secure_commands_exist_and_read_their_principals_config(service: str) -> None:
    args = [str(a) for a in SECURE_SERVICES[service]["command"]]
    path, cmd = _resolve(args[1:])
    assert cmd is not None, f"`triage {' '.join(path)}` is not a triage command"
    known = {opt for p in cmd.params for opt in p.opts}
    used = {a for a in args if a.startswith("--")}
    assert used <= known, f"`triage {' '.join(path)}` has no {sorted(used - known)}"
    base = [str(a) for a in SERVICES.get(service, {}).get("command", args)]
    assert [a for a in args if a != _option(args, "--config")] == [
        a for a in base if a != _option(base, "--config")]  # only the config file differs
    security = _secure_config(service).kafka.security
    assert security.protocol == "SASL_PLAINTEXT" and security.sasl_mechanism == "SCRAM-SHA-512"
    assert security.password_file == f"/run/secrets/{security.username}"
    assert security.username in SECURE_SERVICES[service]["secrets"]


def test_each_container_gets_only_its_principals_secrets(triage_config: TriageConfig) -> None:
    expected = {"kafka": {ADMIN, "controller"}, "topics": {ADMIN}, "admission": {APP},
                "worker-gpu-0": {WORKER}, "worker-gpu-1": {WORKER},
                "kafka-acls": set(principals(triage_config))}  # fmt: skip
    assert {s: set(spec["secrets"]) for s, spec in SECURE_SERVICES.items()} == expected
    assert set(SECURE["secrets"]) == {"controller", *principals(triage_config)}


def test_secrets_come_from_outside_the_repo() -> None:
    for name, spec in SECURE["secrets"].items():
        assert spec["file"].startswith(SECRETS_DIR_VAR), f"secret {name} must come from " \
            "$TRIAGE_SECRETS_DIR"  # fmt: skip
        assert spec["file"].endswith(f"}}/{name}")
    text = (ROOT / "docker-compose.secure.yml").read_text()
    assert "password=" not in text.replace("password=$", "")


@pytest.mark.parametrize("user", ["admin", "app", "worker"])
def test_secure_configs_are_the_compose_config_plus_a_principal(user: str) -> None:
    secured = load_config(ROOT / "ops" / "compose" / "secure" / f"{user}.yaml")
    assert secured.kafka.security.username == user
    plain = _compose_config().model_dump(mode="json")
    mine = secured.model_dump(mode="json")
    mine["kafka"].pop("security")
    plain["kafka"].pop("security")
    assert mine == plain


def test_secure_broker_script_sets_what_the_local_secured_broker_sets(tmp_path: Path) -> None:
    script = (ROOT / _secure_mounts("kafka")["/etc/triage/kafka-secure.sh"]).read_text()
    assert subprocess.run(["sh", "-n", "-c", script], check=False).returncode == 0
    props = broker_security_properties(CredentialStore(tmp_path, "127.0.0.1:9092"))
    keys = [line.split("=", 1)[0] for line in props.splitlines() if "=" in line
            and not line.startswith("#")]  # fmt: skip
    script_keys = {line.split("=", 1)[0] for line in script.splitlines() if "=" in line}
    for key in keys:  # the local client listener is SASL_PLAINTEXT, compose's is INTERNAL
        assert key.replace("listener.name.sasl_plaintext.", "listener.name.internal.") in \
            script_keys, key  # fmt: skip
    for line in props.splitlines():
        if line.startswith(("super.users=", "allow.everyone", "authorizer.class.name=")):
            assert line in script.splitlines()
    assert "--add-scram" in script and "/run/secrets/" in script
    env = SERVICES["kafka"]["environment"]
    assert f"1@kafka:{env['KAFKA_CONTROLLER_QUORUM_VOTERS'].rsplit(':', 1)[1]}" in script
    assert SECURE_SERVICES["kafka"]["command"] == ["sh", "/etc/triage/kafka-secure.sh"]
