"""Errors of the wire contract."""

from __future__ import annotations


class TopicsError(Exception):
    """Base for wire-contract errors."""


class TopicAdminError(TopicsError):
    """Creating or describing topics on the broker failed."""
