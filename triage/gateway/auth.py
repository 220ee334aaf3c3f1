"""API keys of the gateway: which tenant a Bearer key belongs to.

Keys are never stored: the keys file holds SHA-256 digests, and keys given in the
environment are hashed when loaded. A key is a random 256-bit secret (``new_key``), so a
plain, unsalted SHA-256 is enough: salting and slow hashes defend guessable passwords,
and nobody guesses 256 random bits. A lookup compares the presented key's digest with
every stored digest in constant time (``hmac.compare_digest``), all of them, so the
time it takes says nothing about which digest came close.

Keys file (YAML)::

    keys:
      - tenant: rag
        sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        name: rag-prod          # optional, for logs (never the key itself)

Environment (``gateway.keys_env``, default TRIAGE_GATEWAY_KEYS): ``rag:KEY,batch:KEY2``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

KEY_PREFIX = "sk-triage-"
_HEX64 = r"^[0-9a-f]{64}$"
_TENANT = r"^[a-z0-9][a-z0-9_-]*$"


class KeysError(ValueError):
    """The keys file or variable cannot be used (one line: what and where)."""


class _KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(min_length=1, max_length=63, pattern=_TENANT)
    sha256: str = Field(pattern=_HEX64)
    name: str | None = Field(None, max_length=128)


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[_KeyEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key: its digest, its tenant, a name for logs."""

    digest: bytes
    tenant: str
    name: str


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    """A fresh key: ``sk-triage-`` and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyStore:
    """Digest -> tenant, with a constant-time lookup."""

    def __init__(self, keys: list[ApiKey]) -> None:
        self._keys = list(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def tenants(self) -> set[str]:
        return {k.tenant for k in self._keys}

    def lookup(self, presented: str) -> ApiKey | None:
        """The key's entry, or None. Compares against every stored digest."""
        d = digest(presented)
        found: ApiKey | None = None
        for k in self._keys:
            if hmac.compare_digest(d, k.digest) and found is None:
                found = k
        return found

    @classmethod
    def load(
        cls, *, path: str | Path | None, env_var: str, environ: Mapping[str, str] | None = None
    ) -> KeyStore:
        """Keys from the file (if any) and the environment variable (if set)."""
        keys: list[ApiKey] = []
        if path is not None:
            keys.extend(_from_file(Path(path)))
        raw = (os.environ if environ is None else environ).get(env_var, "")
        keys.extend(_from_env(raw, env_var))
        seen: set[bytes] = set()
        for k in keys:
            if k.digest in seen:
                raise KeysError(f"the same key is listed twice (entry {k.name!r})")
            seen.add(k.digest)
        return cls(keys)


def _from_file(path: Path) -> list[ApiKey]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise KeysError(f"cannot read keys file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise KeysError(f"keys file {path} is not YAML: {str(exc).splitlines()[0]}") from None
    try:
        parsed = _KeysFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise KeysError(f"keys file {path}: {where}: {err['msg']}") from None
    return [
        ApiKey(bytes.fromhex(e.sha256), e.tenant, e.name or f"{path.name}#{i}")
        for i, e in enumerate(parsed.keys)
    ]


def _from_env(raw: str, env_var: str) -> list[ApiKey]:
    out = []
    for i, item in enumerate(p.strip() for p in raw.split(",")):
        if not item:
            continue
        tenant, sep, key = item.partition(":")
        tenant = tenant.strip()
        if not sep or not key.strip() or not tenant:
            raise KeysError(f"${env_var} entry {i + 1}: expected tenant:key")
        try:
            _KeyEntry(tenant=tenant, sha256="0" * 64)
        except ValidationError:
            raise KeysError(f"${env_var} entry {i + 1}: bad tenant name {tenant!r}") from None
        out.append(ApiKey(digest(key.strip()), tenant, f"${env_var}#{i + 1}"))
    return out
