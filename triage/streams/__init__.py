"""The admission app's shell: Faust agents, tables, outbox, metrics (thin adapters)."""

import triage.native  # noqa: F401  (codec.py may be compiled: stale builds go first)
