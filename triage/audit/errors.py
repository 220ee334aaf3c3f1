"""Errors of the audit tool."""

from __future__ import annotations


class AuditError(Exception):
    """Base for audit errors."""


class DecisionSourceError(AuditError):
    """The decisions topic or export file could not be read (broker down, topic missing...)."""


class InvalidSinceError(AuditError, ValueError):
    """A --since value that is neither epoch ms, a relative duration, nor an ISO date."""


class NoDecisionsError(AuditError, ValueError):
    """There is nothing to explain: no decision is recorded for the request."""
