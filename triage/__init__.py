"""triage: admission control for multi-tenant GPU inference."""

__version__ = "0.1.0"
