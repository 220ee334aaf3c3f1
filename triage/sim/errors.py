"""Errors of the simulator: bad scenario files, bad traces, runs that cannot finish.

"No room" in the simulated pool is never an error (the core answers it); these are
for broken inputs and broken contracts, each with a message that names the cause.
"""

from __future__ import annotations


class SimError(Exception):
    """Base of every simulator error."""


class ScenarioError(SimError):
    """A scenario file (or its workload section) is invalid or cannot be resolved."""


class TraceError(SimError):
    """A trace file or its column mapping is unusable (missing column, bad value)."""


class PolicyNameError(SimError):
    """A policy name is neither a known variant nor a valid `base+key=value` override."""


class SimulationStuckError(SimError):
    """Requests stayed live past the drain limit: a component stopped making progress."""
