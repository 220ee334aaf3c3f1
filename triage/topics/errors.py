"""Errors of the wire contract."""

from __future__ import annotations

from triage.config.errors import ConfigError


class TopicsError(Exception):
    """Base for wire-contract errors."""


class TopicAdminError(TopicsError):
    """Creating or describing topics on the broker failed."""


class ShardLayoutError(ConfigError):
    """Existing topics have another partition count than the app's shards: the config
    and the broker disagree (a usage error, exit 2, like an invalid config)."""
