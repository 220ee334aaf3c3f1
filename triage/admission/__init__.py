"""The admission core: pure, deterministic, fast. See docs/policy.md.

The hot modules may be compiled with mypyc (`make compile`, setup.py). A compiled
build older than any of its sources is set aside here, before any of them is
imported, so an edited source is never shadowed by a stale extension module: the
pure-Python sources run instead, and a warning says to rebuild. TRIAGE_PURE_CORE=1
runs the sources even beside a fresh build (to compare the two, or to debug).
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

_HERE = Path(__file__).resolve().parent


def _set_aside_stale_build() -> None:
    built = sorted(_HERE.glob("*.cpython-*.so"))
    if not built:
        return
    try:
        sources = {p.stem: p.stat().st_mtime for p in _HERE.glob("*.py")}
        oldest_build = min(so.stat().st_mtime for so in built)
        names = {so.name.split(".", 1)[0] for so in built}
        stale = [n for n in names if sources.get(n, 0.0) > oldest_build]
        if not stale:
            return
        for so in built:  # all or nothing: compiled modules call each other natively
            so.rename(so.with_name(so.name + ".stale"))
    except OSError:
        return
    warnings.warn(
        f"triage: the compiled admission core is older than {', '.join(sorted(stale))}.py; "
        "running the pure-Python sources (rebuild with `make compile`)",
        RuntimeWarning,
        stacklevel=2,
    )


class _SourcesOnly(importlib.abc.MetaPathFinder):
    """Finds this package's modules as sources, never as extension modules."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        source = _HERE / (fullname.rsplit(".", 1)[1] + ".py")
        return importlib.util.spec_from_file_location(fullname, source) if source.exists() else None


if os.environ.get("TRIAGE_PURE_CORE") == "1":
    sys.meta_path.insert(0, _SourcesOnly())
else:
    _set_aside_stale_build()
