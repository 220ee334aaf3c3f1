"""Human units for explanations: thousands separators, binary bytes, seconds.

Binary units (GiB) because KV budgets and GPU memory are configured in GiB.

Kept by hand rather than taken from `humanize`: its binary sizes read the same
(``1.5 GiB``) but its durations are words (``a moment``, ``2 minutes``) where an
explanation needs ``350 ms`` / ``1.2 s``, so it would replace half of 40 lines
with a dependency.
"""

from __future__ import annotations

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def count(x: float) -> str:
    """``2,400``; fractional counts (expected output tokens) are rounded for display."""
    return f"{round(x):,}"


def tokens(x: float) -> str:
    n = round(x)
    return f"{n:,} token" + ("" if abs(n) == 1 else "s")


def human_bytes(n: float) -> str:
    """``1.5 GiB``; plain bytes below 1 KiB."""
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{value:.0f} B" if unit == 0 else f"{value:.1f} {_BYTE_UNITS[unit]}"


def seconds(s: float) -> str:
    """``350 ms`` under a second, ``1.2 s`` under two minutes, ``2.5 min`` beyond."""
    if abs(s) < 1.0:
        return f"{s * 1000:.0f} ms"
    if abs(s) < 120.0:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min"


def millis(ms: float) -> str:
    return seconds(ms / 1000.0)


def percent(ratio: float) -> str:
    return f"{ratio:.0%}"
