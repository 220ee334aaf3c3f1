"""Execution backends of a GPU worker: ``sim`` (a timing model) and ``openai`` (a real
OpenAI-compatible server such as vLLM). Both implement ``base.Backend``."""

from __future__ import annotations

from triage.workers.backends.base import AttemptResult, AttemptStatus, Backend, EngineLoad

__all__ = ["AttemptResult", "AttemptStatus", "Backend", "EngineLoad"]
