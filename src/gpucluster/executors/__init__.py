"""Executors start, watch and signal job processes; the head decides, they only carry out."""

from gpucluster.executors.base import Executor, Exited, LaunchError, LaunchSpec, Lost, Running, Status

__all__ = ["Executor", "Exited", "LaunchError", "LaunchSpec", "Lost", "Running", "Status"]
