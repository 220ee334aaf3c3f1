"""Errors of replay, each with a message that names the cause (the CLI prints it)."""

from __future__ import annotations


class ReplayError(Exception):
    """Base of every replay error."""


class ReplaySourceError(ReplayError):
    """The topics or the export file cannot be read (broker down, topic missing, bad path)."""
