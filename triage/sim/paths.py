"""Where scenario files, configs and traces are found.

A scenario names files relative to itself, to the working directory, or to the
repository; the public Azure trace ships in the repository's ``data/`` (so its
tests run from any clone), and ``TRIAGE_DATA_DIR`` points anywhere else. Trying these in a fixed
order lets the same scenario file run from a clone, an installed package or CI.
"""

from __future__ import annotations

import os
from pathlib import Path

from triage.sim.errors import ScenarioError

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../triage
REPO_DIR = PACKAGE_DIR.parent
SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


def search_dirs(base: Path | None = None) -> list[Path]:
    """Directories a relative path is tried against, in order."""
    dirs: list[Path] = []
    if base is not None:
        dirs.append(base)
    dirs.append(Path.cwd())
    env = os.environ.get("TRIAGE_DATA_DIR")
    if env:
        dirs.append(Path(env))
    dirs += [REPO_DIR, REPO_DIR / "data", REPO_DIR.parent, PACKAGE_DIR]
    unique: list[Path] = []
    for d in dirs:
        if d.resolve() not in (u.resolve() for u in unique):
            unique.append(d)
    return unique


def resolve_path(name: str, *, base: Path | None = None) -> Path:
    """The first existing file for `name` (absolute, or relative to a search dir)."""
    p = Path(name).expanduser()
    if p.is_absolute():
        if p.exists():
            return p
        raise ScenarioError(f"{p}: no such file")
    tried = []
    for d in search_dirs(base):
        cand = d / p
        if cand.exists():
            return cand
        tried.append(str(cand))
    raise ScenarioError(f"{name}: no such file (tried {', '.join(tried)})")


def builtin_scenarios() -> dict[str, Path]:
    """Shipped scenarios by name (file stem)."""
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.yaml"))}
