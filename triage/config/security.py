"""How triage's Kafka clients authenticate: protocol, SASL mechanism, credentials, TLS.

Secrets never live in the config file (which sits in a repository): a password is
named by the environment variable or the file that holds it, and a literal
``password`` key is refused with a message that says so. Resolving those names
to values happens when a client is built (triage/kafka/security.py), not here, so
commands that never talk to Kafka do not need the secrets.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

EnvName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
FilePath = Annotated[str, Field(min_length=1, max_length=4096)]

SecurityProtocol = Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]

SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})

# Keys someone might write to put a secret inline; each is refused by name.
_LITERAL_SECRETS = ("password", "sasl_password", "ssl_key_password", "sasl.password")


class KafkaSecurityConfig(BaseModel):
    """`kafka.security`: PLAINTEXT by default; SASL/SCRAM and TLS for secured brokers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: SecurityProtocol = Field(
        "PLAINTEXT", description="Kafka security.protocol of every triage client."
    )
    sasl_mechanism: SaslMechanism = Field(
        "SCRAM-SHA-512", description="SASL mechanism (SASL_* protocols only)."
    )
    username: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        None, description="SASL user name: the principal is User:<username>."
    )
    password_env: EnvName | None = Field(
        None, description="Environment variable that holds the SASL password."
    )
    password_file: FilePath | None = Field(
        None, description="File whose content (trailing newline dropped) is the SASL password."
    )
    ssl_ca_location: FilePath | None = Field(
        None, description="PEM CA bundle that signed the broker's certificate (TLS only)."
    )
    ssl_certificate_location: FilePath | None = Field(
        None, description="Client certificate (PEM) for mutual TLS."
    )
    ssl_key_location: FilePath | None = Field(None, description="Client private key (PEM).")
    ssl_key_password_env: EnvName | None = Field(
        None, description="Environment variable that holds the private key's passphrase."
    )
    ssl_check_hostname: bool = Field(
        True, description="Verify that the broker's certificate names the host dialled."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_literal_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in _LITERAL_SECRETS:
                if key in data:
                    raise ValueError(
                        f"{key}: a literal secret is not allowed in the config (it would end "
                        "up in a repository); name where it is with password_env or "
                        "password_file (ssl_key_password_env for a key passphrase)"
                    )
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        sasl = self.protocol in SASL_PROTOCOLS
        given = [n for n in ("password_env", "password_file") if getattr(self, n) is not None]
        if sasl:
            if self.username is None:
                raise ValueError(f"username is required with protocol {self.protocol}")
            if len(given) != 1:
                raise ValueError(
                    f"protocol {self.protocol} needs exactly one of password_env or "
                    f"password_file (got {', '.join(given) or 'neither'})"
                )
        elif self.username is not None or given:
            raise ValueError(
                f"username/password_env/password_file need a SASL protocol (SASL_PLAINTEXT "
                f"or SASL_SSL), not {self.protocol}"
            )
        tls_fields = [n for n in ("ssl_ca_location", "ssl_certificate_location",
                                  "ssl_key_location", "ssl_key_password_env")
                      if getattr(self, n) is not None]  # fmt: skip
        if tls_fields and self.protocol not in TLS_PROTOCOLS:
            raise ValueError(
                f"{', '.join(tls_fields)} need protocol SSL or SASL_SSL, not {self.protocol}"
            )
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("ssl_certificate_location and ssl_key_location go together")
        return self

    @property
    def sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS

    @property
    def tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS
