"""`triage gateway` and `triage gateway-key` on the command line: one-line errors with
exit status 2, a key whose digest is the printed keys-file entry. The command runs as a
process (as a user runs it), never serving: every case here fails before it binds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from triage.gateway.auth import KeyStore, digest


def triage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "TRIAGE_GATEWAY_KEYS"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "triage", *args], capture_output=True,
                          text=True, timeout=120, env=full_env)  # fmt: skip


def test_gateway_key_prints_a_key_and_its_entry(tmp_path: Path) -> None:
    out = triage("gateway-key", "--tenant", "rag", "--name", "rag-prod")
    assert out.returncode == 0, out.stderr
    key = re.search(r"^key: (\S+)$", out.stdout, re.M)
    sha = re.search(r"sha256: ([0-9a-f]{64})$", out.stdout, re.M)
    assert key and sha and digest(key.group(1)).hex() == sha.group(1)
    entry = out.stdout.split("keys file entry:\n", 1)[1]
    (tmp_path / "keys.yaml").write_text("keys:\n" + entry)
    store = KeyStore.load(path=tmp_path / "keys.yaml", env_var="UNSET_VAR", environ={})
    hit = store.lookup(key.group(1))
    assert hit is not None and hit.tenant == "rag" and hit.name == "rag-prod"
    bad = triage("gateway-key", "--tenant", "Not OK")
    assert bad.returncode == 2 and "bad tenant name" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_gateway_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    none = triage("gateway")
    assert none.returncode == 2 and "no API keys" in none.stderr
    bad = tmp_path / "keys.yaml"
    bad.write_text("keys:\n  - tenant: rag\n    sha256: nothex\n")
    out = triage("gateway", "--keys", str(bad))
    assert out.returncode == 2 and "keys.0.sha256" in out.stderr
    env = triage("gateway", env={"TRIAGE_GATEWAY_KEYS": "no-colon-here"})
    assert env.returncode == 2 and "tenant:key" in env.stderr
    cfg = tmp_path / "triage.yaml"
    cfg.write_text("tenants: []\n")
    broken = triage("gateway", "--config", str(cfg))  # the config's usual field-per-line
    assert broken.returncode == 2 and "tenants" in broken.stderr
    assert broken.stderr.startswith("error: ") and "Traceback" not in broken.stderr
    for r in (none, out, env):
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
