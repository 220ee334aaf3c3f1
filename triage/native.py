"""The mypyc build of the hot modules: its freshness guard and the pure-Python switch.

`make compile` (setup.py) compiles the admission core, the simulator's event loop, the
reason-code enums and the app's record builders (streams/codec.py) to C extension
modules beside their sources, as one group:
compiled modules call each other natively, so the group is used whole or not at all.
Each package holding compiled modules imports this module first thing in its
__init__ (importing it runs `guard()` once per process), before any of them loads:

- a build older than any of its sources is set aside (renamed *.so.stale) in every
  package of the group, so an edited source is never shadowed by a stale extension
  module; the sources run, and a warning says to rebuild;
- TRIAGE_PURE_CORE=1 runs the sources even beside a fresh build (to compare the two,
  or to debug).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

_ROOT = Path(__file__).resolve().parent
# the packages with compiled modules (setup.py COMPILED)
PACKAGES = ("admission", "sim", "topics", "streams")
PURE_ENV = "TRIAGE_PURE_CORE"
_done = False


def _builds() -> list[Path]:
    return sorted(so for pkg in PACKAGES for so in (_ROOT / pkg).glob("*.cpython-*.so"))


def stale_sources() -> list[str]:
    """Sources newer than the oldest compiled module of the group ('pkg/name.py')."""
    built = _builds()
    if not built:
        return []
    oldest = min(so.stat().st_mtime for so in built)
    stale = []
    for so in built:
        src = so.with_name(so.name.split(".", 1)[0] + ".py")
        if src.exists() and src.stat().st_mtime > oldest:
            stale.append(f"{so.parent.name}/{src.name}")
    return sorted(stale)


def _set_aside_stale_build() -> None:
    try:
        stale = stale_sources()
        if not stale:
            return
        for so in _builds():  # all or nothing: compiled modules call each other natively
            so.rename(so.with_name(so.name + ".stale"))
    except OSError:
        return
    warnings.warn(
        f"triage: the compiled build is older than {', '.join(stale)}; "
        "running the pure-Python sources (rebuild with `make compile`)",
        RuntimeWarning,
        stacklevel=3,
    )


class _SourcesOnly(importlib.abc.MetaPathFinder):
    """Finds the group's modules as sources, never as extension modules."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if len(parts) != 3 or parts[0] != "triage" or parts[1] not in PACKAGES:
            return None
        source = _ROOT / parts[1] / (parts[2] + ".py")
        return importlib.util.spec_from_file_location(fullname, source) if source.exists() else None


def pure() -> bool:
    """Are the sources forced (TRIAGE_PURE_CORE=1)?"""
    return os.environ.get(PURE_ENV) == "1"


def guard() -> None:
    """Run once per process, from each compiled package's __init__."""
    global _done
    if _done:
        return
    _done = True
    if pure():
        sys.meta_path.insert(0, _SourcesOnly())
    else:
        _set_aside_stale_build()


guard()
