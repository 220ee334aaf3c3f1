"""The admission core: pure, deterministic, fast. See docs/policy.md.

The hot modules may be compiled with mypyc (`make compile`, setup.py); triage.native
sets a stale build aside before any of them is imported, and TRIAGE_PURE_CORE=1
runs the sources instead.
"""

from __future__ import annotations

import triage.native  # noqa: F401  (sets a stale compiled build aside first)
