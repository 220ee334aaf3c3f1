"""The local broker's secured mode: SASL/SCRAM users, their passwords, broker settings.

Layout, all under the broker's data dir (outside the repository; refused inside it):

- ``credentials/<user>.password`` (0600, in a 0700 dir): one generated password per
  principal. Configs point at these with ``kafka.security.password_file``.
- ``credentials.yaml`` (0600): for each principal the ``kafka.security`` block to paste
  into a config. It names the password files, never a password.

The client listener speaks SASL_PLAINTEXT with SCRAM-SHA-512 only. The CONTROLLER
listener (loopback, port + 1) speaks SASL_PLAINTEXT with PLAIN and a single static
user, `controller`, whose password only server.properties (0600) knows: KRaft
controllers cannot check SCRAM (the credentials live in the metadata they serve),
and a PLAINTEXT controller listener would let any local process in as the
super user User:ANONYMOUS. `admin` is created at format time (KIP-900) because the
broker itself logs in as admin to its own listener; every other user and all ACLs
go through the Admin API once the broker answers (`provision`), idempotently.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not in __all__
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from triage.config.models import TriageConfig
from triage.config.security import KafkaSecurityConfig
from triage.kafka.acls import ADMIN, acl_table, apply_acls, principals
from triage.kafka.clients import make_admin
from triage.kafka.security import librdkafka_settings
from triage.topics.names import TopicNames

MECHANISM = "SCRAM-SHA-512"
PROTOCOL = "SASL_PLAINTEXT"
CONTROLLER_USER = "controller"
SCRAM_ITERATIONS = 8192
_TIMEOUT_S = 30.0


class CredentialError(RuntimeError):
    """A principal's password file is missing from a directory triage may not write."""


class CredentialStore:
    """Passwords of one secured broker's principals, one private file per user.

    The local broker's store generates them (`<data dir>/credentials/<user>.password`);
    a deployment's store reads files someone else made (`--secrets-dir`, e.g. Docker
    secrets in /run/secrets/<user>) and never writes.
    """

    def __init__(self, data_dir: Path, bootstrap: str) -> None:
        self.dir = data_dir / "credentials"
        self.index: Path | None = data_dir / "credentials.yaml"
        self.bootstrap = bootstrap
        self.suffix = ".password"
        self.generate = True

    @classmethod
    def read_only(cls, secrets_dir: Path, bootstrap: str, suffix: str = "") -> CredentialStore:
        store = cls(secrets_dir, bootstrap)
        store.dir, store.index, store.suffix, store.generate = secrets_dir, None, suffix, False
        return store

    def path(self, user: str) -> Path:
        return self.dir / f"{user}{self.suffix}"

    def password(self, user: str) -> str:
        """The user's password, generated (and written 0600) on first use."""
        p = self.path(user)
        if p.is_file():
            return p.read_text(encoding="utf-8").strip()
        if not self.generate:
            raise CredentialError(f"no password file for principal {user!r}: {p} is missing")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        value = secrets.token_urlsafe(24)  # URL-safe: no quote or ';' to escape in JAAS
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(value + "\n")
        return value

    def users(self) -> list[str]:
        if not self.dir.is_dir():
            return []
        found = (p.name.removesuffix(self.suffix) for p in self.dir.glob(f"*{self.suffix}"))
        return sorted(u for u in found if u != CONTROLLER_USER)

    def security(self, user: str) -> KafkaSecurityConfig:
        """The `kafka.security` block of a config that speaks as `user`."""
        self.password(user)
        return KafkaSecurityConfig(protocol=PROTOCOL, sasl_mechanism=MECHANISM, username=user,
                                   password_file=str(self.path(user)))  # fmt: skip

    def settings(self, user: str) -> dict[str, Any]:
        """librdkafka properties of a client that speaks as `user`."""
        return librdkafka_settings(self.security(user))

    def _block(self, user: str) -> dict[str, Any]:
        sec = self.security(user)
        return {"protocol": sec.protocol, "sasl_mechanism": sec.sasl_mechanism,
                "username": sec.username, "password_file": sec.password_file}

    def write_index(self) -> Path | None:
        """credentials.yaml: where each principal's password is, and how to use it."""
        if self.index is None:
            return None
        doc = {
            "bootstrap_servers": self.bootstrap,
            "principals": {
                u: {"kafka": {"bootstrap_servers": self.bootstrap,
                              "security": self._block(u)}}
                for u in self.users()
            },
        }  # fmt: skip
        header = (
            "# Written by `triage kafka up --secure`. Private (0600): it names the password\n"
            "# files of this broker's principals. Copy a principal's `kafka` block into the\n"
            "# config of the process that speaks as it. Never commit this file.\n"
        )
        tmp = self.index.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(header + yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.index)
        return self.index


def broker_security_properties(store: CredentialStore) -> str:
    """The server.properties lines of the secured mode (they hold two passwords)."""
    admin_pw = store.password(ADMIN)
    controller_pw = store.password(CONTROLLER_USER)
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    return "\n".join([
        "# --- secured mode (triage kafka up --secure) ---------------------------------",
        f"sasl.enabled.mechanisms={MECHANISM}",
        f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
        f"listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config={scram} required "
        f'username="{ADMIN}" password="{admin_pw}";',
        "sasl.mechanism.controller.protocol=PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        f"listener.name.controller.plain.sasl.jaas.config={plain} required "
        f'username="{CONTROLLER_USER}" password="{controller_pw}" '
        f'user_{CONTROLLER_USER}="{controller_pw}";',
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN};User:{CONTROLLER_USER}",
        "allow.everyone.if.no.acl.found=false",
        "",
    ])  # fmt: skip


def format_scram_args(store: CredentialStore) -> list[str]:
    """StorageTool arguments that create `admin` at format time."""
    return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={store.password(ADMIN)}]"]


@dataclass(frozen=True, slots=True)
class ProvisionResult:
    """What `provision` made sure of."""

    users: list[str]
    acls: int  # bindings created or confirmed
    credentials: Path | None  # credentials.yaml (None for a read-only store)


def provision(store: CredentialStore, config: TriageConfig, names: TopicNames | None = None,
              *, admin_settings: dict[str, Any] | None = None) -> ProvisionResult:  # fmt: skip
    """Create (or re-set) every principal's SCRAM credential and every ACL of `config`,
    logged in as admin (`admin_settings`, default: the store's admin password)."""
    login = admin_settings if admin_settings is not None else store.settings(ADMIN)
    admin = make_admin(store.bootstrap, log_level=4, **login)
    users = principals(config)
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
            store.password(u).encode())
        for u in users if u != ADMIN
    ]  # fmt: skip
    for future in admin.alter_user_scram_credentials(upserts, request_timeout=_TIMEOUT_S).values():
        future.result()
    count = apply_acls(admin, acl_table(config, names))
    return ProvisionResult(users=users, acls=count, credentials=store.write_index())
