"""Errors raised while loading configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file is missing, unreadable or invalid; the message names the field."""
