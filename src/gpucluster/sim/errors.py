"""Errors a user can cause: each carries one message that says where the problem is and what to do."""

from __future__ import annotations

from gpucluster.errors import GpuclusterError


class SimInputError(ValueError, GpuclusterError):
    """Bad input (cluster spec, trace, policy, output dir); the CLI prints it and exits 1."""


class SimulationError(RuntimeError, GpuclusterError):
    """The simulation reached a state that must not happen (e.g. a plan that double-books a GPU).

    Raised instead of carrying on, because numbers from a broken run would be silently wrong.
    """
