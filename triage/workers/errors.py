"""Errors of the GPU workers. Execution failures are results, not exceptions; these
are for a worker that cannot be set up as asked."""

from __future__ import annotations


class WorkerError(Exception):
    """Base of worker errors."""


class UnknownGpuError(WorkerError, KeyError):
    """The GPU id is not in the configuration; the message names the configured ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class BackendError(WorkerError):
    """A backend cannot be built or started (bad URL, unknown kind)."""
