"""kafka.security (no literal secrets, consistent fields), the client settings it turns
into, the credential store's file modes, and the ACL table's guarantees as data."""

from __future__ import annotations

import re
import ssl
import stat
import subprocess
from pathlib import Path
from typing import Any

import faust
import pytest
import yaml
from typer.testing import CliRunner

from triage.cli.main import app as cli_app
from triage.config import ConfigError, TriageConfig, config_from_dict
from triage.config.security import KafkaSecurityConfig
from triage.kafka.acls import APP, WORKER, Grant, acl_table, principals, tenant_user, to_bindings
from triage.kafka.clients import make_producer
from triage.kafka.secure import CredentialStore, broker_security_properties
from triage.kafka.security import (
    KafkaSecurityError,
    faust_credentials,
    librdkafka_settings,
    register_settings,
    registered_settings,
    ssl_context,
    use_kafka_security,
)
from triage.topics.names import TopicNames


def _with_security(triage_config: TriageConfig, security: dict[str, Any]) -> TriageConfig:
    data = triage_config.model_dump(mode="json")
    data["kafka"]["security"] = security
    return config_from_dict(data)


SASL = {"protocol": "SASL_PLAINTEXT", "username": "app", "password_env": "TRIAGE_TEST_PW"}


def test_plaintext_is_the_default_and_adds_nothing(triage_config: TriageConfig) -> None:
    assert triage_config.kafka.security.protocol == "PLAINTEXT"
    assert librdkafka_settings(triage_config.kafka.security) == {}
    assert faust_credentials(triage_config.kafka.security) is None


@pytest.mark.parametrize("key", ["password", "sasl_password", "ssl_key_password"])
def test_a_literal_secret_is_refused_by_name(triage_config: TriageConfig, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"kafka\.security: {key}: a literal secret"):
        _with_security(triage_config, {**SASL, key: "hunter2"})


@pytest.mark.parametrize(("security", "message"), [
    ({"protocol": "SASL_PLAINTEXT", "password_env": "X"}, "username is required"),
    ({"protocol": "SASL_SSL", "username": "a"}, "exactly one of password_env or password_file"),
    ({**SASL, "password_file": "/x"}, "exactly one of"),
    ({"protocol": "PLAINTEXT", "username": "a"}, "need a SASL protocol"),
    ({"protocol": "SASL_PLAINTEXT", "username": "a", "password_env": "X",
      "ssl_ca_location": "/ca.pem"}, "need protocol SSL or SASL_SSL"),
    ({"protocol": "SSL", "ssl_certificate_location": "/c.pem"}, "go together"),
    ({"protocol": "SASL_PLAINTEXT", "username": "a", "password_env": "1BAD"}, "pattern"),
    ({"protocol": "KERBEROS"}, "protocol"),
])  # fmt: skip
def test_inconsistent_security_is_refused(
    triage_config: TriageConfig, security: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _with_security(triage_config, security)


def test_sasl_settings_read_the_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, triage_config: TriageConfig
) -> None:
    sec = _with_security(triage_config, SASL).kafka.security
    monkeypatch.delenv("TRIAGE_TEST_PW", raising=False)
    with pytest.raises(KafkaSecurityError, match="environment variable TRIAGE_TEST_PW is not set"):
        librdkafka_settings(sec)
    monkeypatch.setenv("TRIAGE_TEST_PW", "s3cret")
    assert librdkafka_settings(sec) == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app", "sasl.password": "s3cret",
    }  # fmt: skip
    creds = faust_credentials(sec)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, str(creds.mechanism.value)) == (
        "app", "s3cret", "SCRAM-SHA-512")
    assert str(creds.protocol.value) == "SASL_PLAINTEXT"


def test_sasl_settings_read_the_password_from_a_file(tmp_path: Path) -> None:
    missing = KafkaSecurityConfig(protocol="SASL_SSL", username="w",
                                  password_file=str(tmp_path / "pw"), ssl_ca_location="/ca.pem",
                                  ssl_check_hostname=False)  # fmt: skip
    with pytest.raises(KafkaSecurityError, match="cannot read"):
        librdkafka_settings(missing)
    (tmp_path / "pw").write_text("")
    with pytest.raises(KafkaSecurityError, match="is empty"):
        librdkafka_settings(missing)
    (tmp_path / "pw").write_text("from-a-file\n")
    conf = librdkafka_settings(missing)
    assert conf["sasl.password"] == "from-a-file"
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["ssl.ca.location"] == "/ca.pem"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"


def test_a_process_declares_its_principal_once_per_bootstrap(
    monkeypatch: pytest.MonkeyPatch, triage_config: TriageConfig
) -> None:
    monkeypatch.setenv("TRIAGE_TEST_PW", "pw")
    cfg = _with_security(triage_config, SASL)
    bootstrap = "127.0.0.1:1"  # nothing listens: the clients below never connect
    try:
        assert use_kafka_security(cfg.kafka, bootstrap=bootstrap)["sasl.username"] == "app"
        assert registered_settings(bootstrap)["sasl.password"] == "pw"
        assert registered_settings("127.0.0.1:2") == {}  # other brokers stay plaintext
        make_producer(bootstrap).flush(0)  # accepted by librdkafka as a SASL client
        register_settings(bootstrap, {})
        assert registered_settings(bootstrap) == {}
    finally:
        register_settings(bootstrap, {})


def test_the_credential_store_keeps_secrets_private(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path, "127.0.0.1:9292")
    pw = store.password("app")
    assert store.password("app") == pw and len(pw) >= 24  # generated once, then kept
    assert stat.S_IMODE(store.path("app").stat().st_mode) == 0o600
    assert stat.S_IMODE(store.dir.stat().st_mode) == 0o700
    props = broker_security_properties(store)
    assert "allow.everyone.if.no.acl.found=false" in props
    assert "super.users=User:admin;User:controller" in props
    assert "ANONYMOUS" not in props
    index = store.write_index()
    assert stat.S_IMODE(index.stat().st_mode) == 0o600
    text = index.read_text()
    assert pw not in text and str(store.path("app")) in text
    assert librdkafka_settings(store.security("app"))["sasl.password"] == pw


# --------------------------------------------------------------------------- ACL table


def _writers(grants: list[Grant], topic: str) -> set[str]:
    return {g.user for g in grants if g.resource == "topic" and "WRITE" in g.operations
            and (topic.startswith(g.name) if g.prefixed else topic == g.name)}  # fmt: skip


def _readers(grants: list[Grant], topic: str) -> set[str]:
    return {g.user for g in grants if g.resource == "topic" and "READ" in g.operations
            and (topic.startswith(g.name) if g.prefixed else topic == g.name)}  # fmt: skip


def test_acl_table_gives_each_topic_its_writers_and_readers(triage_config: TriageConfig) -> None:
    n = TopicNames(triage_config.kafka.topic_prefix)
    grants = acl_table(triage_config, n)
    tenants = [t.name for t in triage_config.tenants]
    for t in tenants:
        assert _writers(grants, n.requests(t)) == {tenant_user(t)}
        assert _readers(grants, n.requests(t)) == {APP}
        assert _writers(grants, n.replies(t)) == {APP}
        assert _readers(grants, n.replies(t)) == {tenant_user(t)}
    for g in triage_config.all_gpus():
        for topic in (n.gpu_work(g), n.gpu_control(g)):
            assert _writers(grants, topic) == {APP}
            assert _readers(grants, topic) == {WORKER}
    assert _writers(grants, n.completions) == {WORKER}
    assert _writers(grants, n.gpu_status) == {WORKER}
    for topic in (n.decisions, n.autoscale):
        assert _writers(grants, topic) == {APP}
        assert _readers(grants, topic) == set()  # operators read them as admin
    assert _writers(grants, n.admission) == {APP}
    assert _writers(grants, n.deadletter) == {APP, WORKER}
    # the routes (model -> partition, no tenant's data): the app writes, every tenant reads
    assert _writers(grants, n.routes) == {APP}
    assert _readers(grants, n.routes) == {APP, *(tenant_user(t) for t in tenants)}
    # A tenant's grants name only its own topics and groups, and the routes.
    for t in tenants:
        mine = [g for g in grants if g.user == tenant_user(t)]
        assert all(t in g.name or g.name == n.routes for g in mine)
        assert not any(g.prefixed for g in mine if g.resource == "topic")
    assert principals(triage_config)[:3] == ["admin", "app", "worker"]
    bindings = to_bindings(grants)
    assert len(bindings) == sum(len(g.operations) for g in grants)


def test_a_tenant_cannot_take_a_role_name(triage_config: TriageConfig) -> None:
    assert tenant_user("app") == "tenant-app" != APP
    assert len(set(principals(triage_config))) == len(principals(triage_config))


def test_docs_security_lists_the_acl_table_of_the_example(triage_config: TriageConfig) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    rows = [line for line in doc.splitlines()
            if line.startswith("| `User:") and line.count("|") == 6]  # fmt: skip
    per_tenant = acl_table(triage_config)
    data = triage_config.model_dump(mode="json")
    data["kafka"]["tenant_topics"] = "shared"
    shared = acl_table(TriageConfig.model_validate(data))  # its own rows follow
    expected = [
        f"| `{g.principal}` | {g.resource} | {'prefixed' if g.prefixed else 'literal'} | "
        f"`{g.name}` | {', '.join(g.operations)} |"
        for g in [*per_tenant, *(g for g in shared if g not in per_tenant)]
    ]
    assert rows == expected


@pytest.mark.parametrize("args", [
    ["admission"], ["worker", "--gpu", "gpu-0", "--backend", "sim"], ["topics", "create"],
    ["submit", "--tenant", "rag", "--model", "llama-3.1-8b", "--prompt-tokens", "10",
     "--max-tokens", "10"],
    ["audit", "some-request"],
])  # fmt: skip
def test_an_unset_password_stops_each_command_with_one_line(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    triage_config: TriageConfig,
) -> None:
    monkeypatch.delenv("TRIAGE_TEST_PW", raising=False)
    data = triage_config.model_dump(mode="json")
    data["kafka"] = {"bootstrap_servers": "127.0.0.1:1", "security": SASL}  # never dialled
    cfg = tmp_path / "triage.yaml"
    cfg.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli_app, [*args, "--config", str(cfg)])
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())  # typer's error box
    assert "environment variable TRIAGE_TEST_PW is not set" in flat
    assert "Traceback" not in result.output


def test_tls_settings_build_a_verifying_context_from_real_pem_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CA, a client certificate and an encrypted key made with openssl: the SSLContext
    Faust gets loads them and verifies servers; librdkafka gets the same paths."""
    key, cert = tmp_path / "client.key", tmp_path / "client.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=triage-test",
                    "-passout", "pass:keypass"], check=True, capture_output=True)  # fmt: skip
    monkeypatch.setenv("TRIAGE_TEST_PW", "pw")
    monkeypatch.setenv("TRIAGE_TEST_KEY_PW", "keypass")
    sec = KafkaSecurityConfig(protocol="SASL_SSL", username="app", password_env="TRIAGE_TEST_PW",
                              ssl_ca_location=str(cert), ssl_certificate_location=str(cert),
                              ssl_key_location=str(key), ssl_key_password_env="TRIAGE_TEST_KEY_PW")
    ctx = ssl_context(sec)
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    assert any(c.get("subject") == ((("commonName", "triage-test"),),)
               for c in ctx.get_ca_certs())  # fmt: skip
    creds = faust_credentials(sec)
    assert isinstance(creds, faust.SASLCredentials)
    assert str(creds.protocol.value) == "SASL_SSL" and creds.ssl_context is not None
    conf = librdkafka_settings(sec)
    assert conf["ssl.key.password"] == "keypass"
    assert conf["ssl.certificate.location"] == str(cert)
    assert conf["ssl.endpoint.identification.algorithm"] == "https"
    monkeypatch.setenv("TRIAGE_TEST_KEY_PW", "wrong")
    with pytest.raises(ssl.SSLError):
        ssl_context(sec)
    tls_only = KafkaSecurityConfig(protocol="SSL", ssl_ca_location=str(cert))
    assert isinstance(faust_credentials(tls_only), faust.SSLCredentials)
    assert "sasl.username" not in librdkafka_settings(tls_only)
