"""Kafka's jars for the local broker: resolved once by Maven into a cache outside the repo.

`install_jars` runs Maven (ops/kafka/pom.xml) only when the cache is missing or was
filled from another pom; a marker file holds the pom's digest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from triage.kafka.local_types import LocalBrokerError, ToolMissingError

log = logging.getLogger(__name__)

KAFKA_VERSION = "3.9.1"  # keep in sync with ops/kafka/pom.xml
REPO_ROOT = Path(__file__).resolve().parents[2]
OPS_DIR = REPO_ROOT / "ops" / "kafka"
KAFKA_JAR = f"kafka_2.13-{KAFKA_VERSION}.jar"


def kafka_home() -> Path:
    """Where the jars live: $TRIAGE_KAFKA_HOME, else ~/.cache/triage/kafka/<version>."""
    env = os.environ.get("TRIAGE_KAFKA_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "triage" / "kafka" / KAFKA_VERSION


def require_tool(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ToolMissingError(f"{tool} not found on PATH: {hint}")
    return path


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two `up` calls do not race."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def jars_installed(home: Path) -> bool:
    """The cache under `home` holds the jars of the current pom."""
    marker = home / ".installed"
    return (
        (home / "lib" / KAFKA_JAR).is_file()
        and marker.is_file()
        and marker.read_text().strip() == pom_digest()
    )


def install_jars(home: Path, *, force: bool = False) -> bool:
    """Copy Kafka's runtime jars from Maven into the cache; True when Maven ran."""
    pom = OPS_DIR / "pom.xml"
    if not pom.is_file():
        raise LocalBrokerError(f"{pom} not found: the local broker needs a source checkout")
    lib = home / "lib"
    with locked(home / ".lock"):
        if jars_installed(home) and not force:
            return False
        mvn = require_tool("mvn", "install Apache Maven 3.8+ (e.g. apt-get install maven)")
        staging = home / f"lib.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom),
            "dependency:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]  # fmt: skip
        log.info("resolving Kafka %s with Maven into %s", KAFKA_VERSION, lib)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0 or not (staging / KAFKA_JAR).is_file():
            shutil.rmtree(staging, ignore_errors=True)
            out = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise LocalBrokerError(f"Maven could not resolve Kafka {KAFKA_VERSION}:\n{out}")
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        (home / ".installed").write_text(pom_digest() + "\n")
        return True


def pom_digest() -> str:
    return hashlib.sha256((OPS_DIR / "pom.xml").read_bytes()).hexdigest()
