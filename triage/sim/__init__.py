"""The virtual-time simulator. Its event loop and GPU model may be compiled with the
admission core (`make compile`); triage.native guards that build."""

from __future__ import annotations

import triage.native  # noqa: F401  (sets a stale compiled build aside first)
