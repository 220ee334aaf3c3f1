"""The admission core: pure, deterministic, fast. See docs/policy.md.

The hot modules may be compiled with mypyc (`make compile`, setup.py). A compiled
build older than any of its sources is set aside here, before any of them is
imported, so an edited source is never shadowed by a stale extension module: the
pure-Python sources run instead, and a warning says to rebuild.
"""

from __future__ import annotations

import warnings
from pathlib import Path


def _set_aside_stale_build() -> None:
    here = Path(__file__).resolve().parent
    built = sorted(here.glob("*.cpython-*.so"))
    if not built:
        return
    try:
        sources = {p.stem: p.stat().st_mtime for p in here.glob("*.py")}
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


_set_aside_stale_build()
