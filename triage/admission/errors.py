"""Errors of the admission core. "No room" is a decision, never an exception: these
are raised only when a caller breaks the core's contract."""

from __future__ import annotations


class AdmissionError(Exception):
    """Base of the core's errors."""


class UnknownTenantError(AdmissionError):
    """A request names a tenant the core was not configured with (validate first)."""


class UnknownModelError(AdmissionError):
    """A request names a model no pool serves (validate first)."""


class UnknownGpuError(AdmissionError):
    """An event names a GPU the pool does not hold."""
