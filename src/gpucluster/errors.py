"""The package's one root exception type.

Every exception class gpucluster defines derives from `GpuclusterError`, so a program that
embeds the package (a notebook, a service, the CLI's last-resort handler) can tell "gpucluster
refused or failed" from a bug elsewhere with one `except`. The classes keep their older bases
too (ValueError, RuntimeError, LookupError, PermissionError, OSError...): callers that catch
those keep working. This module imports nothing, so any module (the job shim's stdlib-only
helpers included) may import it without pulling the rest of the package in.
"""

from __future__ import annotations


class GpuclusterError(Exception):
    """Root of every exception the package defines."""


__all__ = ["GpuclusterError"]
