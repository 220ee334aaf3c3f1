"""Client-side Kafka security: `kafka.security` turned into librdkafka and Faust settings.

Every triage process talks to one broker as one principal (the admission app as
`app`, a worker as `worker`, a tenant's client as its tenant). A process declares
its principal once, with `use_kafka_security(config.kafka)`; from then on every
client that `triage.kafka.clients` builds for that bootstrap address carries the
settings, however deep in the code it is built (topic admin, outbox, delivery
seed, scanners). Settings passed explicitly to a client still win, so one process
may also speak as several principals (tests do).

Secrets are read here, when a client is about to connect: from the environment
variable or the file the config names, never from the config itself.
"""

from __future__ import annotations

import os
import ssl
import threading
from pathlib import Path
from typing import Any

from triage.config.errors import ConfigError
from triage.config.models import KafkaConfig
from triage.config.security import KafkaSecurityConfig


class KafkaSecurityError(ConfigError):
    """A credential the config names cannot be read (unset variable, missing file)."""


_lock = threading.Lock()
_registered: dict[str, dict[str, Any]] = {}


def read_secret(*, env: str | None, file: str | None, what: str) -> str:
    """The secret in environment variable `env` or in `file` (one trailing newline dropped)."""
    if env is not None:
        value = os.environ.get(env)
        if not value:
            raise KafkaSecurityError(f"{what}: environment variable {env} is not set")
        return value
    if file is not None:
        path = Path(file).expanduser()
        try:
            value = path.read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
        except OSError as exc:
            raise KafkaSecurityError(f"{what}: cannot read {path}: {exc.strerror}") from None
        if not value:
            raise KafkaSecurityError(f"{what}: {path} is empty")
        return value
    raise KafkaSecurityError(f"{what}: neither an environment variable nor a file is named")


def sasl_password(sec: KafkaSecurityConfig) -> str:
    return read_secret(env=sec.password_env, file=sec.password_file,
                       what="kafka.security.password")  # fmt: skip


def _key_password(sec: KafkaSecurityConfig) -> str | None:
    if sec.ssl_key_password_env is None:
        return None
    return read_secret(env=sec.ssl_key_password_env, file=None,
                       what="kafka.security.ssl_key_password_env")  # fmt: skip


def librdkafka_settings(sec: KafkaSecurityConfig) -> dict[str, Any]:
    """confluent-kafka (librdkafka) properties for `sec`; {} for PLAINTEXT."""
    if sec.protocol == "PLAINTEXT":
        return {}
    conf: dict[str, Any] = {"security.protocol": sec.protocol}
    if sec.sasl:
        conf["sasl.mechanism"] = sec.sasl_mechanism
        conf["sasl.username"] = sec.username
        conf["sasl.password"] = sasl_password(sec)
    if sec.tls:
        if sec.ssl_ca_location is not None:
            conf["ssl.ca.location"] = str(Path(sec.ssl_ca_location).expanduser())
        if sec.ssl_certificate_location is not None:
            conf["ssl.certificate.location"] = str(Path(sec.ssl_certificate_location).expanduser())
        if sec.ssl_key_location is not None:
            conf["ssl.key.location"] = str(Path(sec.ssl_key_location).expanduser())
        key_password = _key_password(sec)
        if key_password is not None:
            conf["ssl.key.password"] = key_password
        check = "https" if sec.ssl_check_hostname else "none"
        conf["ssl.endpoint.identification.algorithm"] = check
    return conf


def ssl_context(sec: KafkaSecurityConfig) -> ssl.SSLContext:
    """The TLS context Faust's (aiokafka's) connections use: same CA, cert and checks."""
    cafile = str(Path(sec.ssl_ca_location).expanduser()) if sec.ssl_ca_location else None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if sec.ssl_certificate_location is not None and sec.ssl_key_location is not None:
        ctx.load_cert_chain(str(Path(sec.ssl_certificate_location).expanduser()),
                            str(Path(sec.ssl_key_location).expanduser()),
                            password=_key_password(sec))  # fmt: skip
    ctx.check_hostname = sec.ssl_check_hostname
    return ctx


def faust_credentials(sec: KafkaSecurityConfig) -> Any:
    """`broker_credentials` for faust.App: None (PLAINTEXT), SASL or SSL credentials."""
    if sec.protocol == "PLAINTEXT":
        return None
    import faust  # heavy import: only the admission app needs it

    ctx = ssl_context(sec) if sec.tls else None
    if sec.sasl:
        return faust.SASLCredentials(username=sec.username, password=sasl_password(sec),
                                     mechanism=sec.sasl_mechanism, ssl_context=ctx)  # fmt: skip
    return faust.SSLCredentials(ctx)


def use_kafka_security(kafka: KafkaConfig, *, bootstrap: str | None = None) -> dict[str, Any]:
    """Make every client this process builds for `bootstrap` (default: the config's) speak
    as `kafka.security` says; returns the settings. Raises KafkaSecurityError when a
    credential cannot be read, so a process fails at start-up, not at its first send."""
    settings = librdkafka_settings(kafka.security)
    register_settings(bootstrap or kafka.bootstrap_servers, settings)
    return settings


def register_settings(bootstrap: str, settings: dict[str, Any]) -> None:
    """Record (or, with {}, forget) the security settings of clients for `bootstrap`."""
    with _lock:
        if settings:
            _registered[bootstrap] = dict(settings)
        else:
            _registered.pop(bootstrap, None)


def registered_settings(bootstrap: str) -> dict[str, Any]:
    """The security settings declared for `bootstrap` ({} when none: PLAINTEXT)."""
    with _lock:
        return dict(_registered.get(bootstrap, {}))
