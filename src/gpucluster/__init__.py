"""gpucluster: the software of a GPU cluster.

`gpucluster.Client(url).submit(...)` is the Python SDK. Imports are lazy so that importing the
package (as every job's environment may) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpucluster.client import ApiError, Client, ClusterUnreachable
    from gpucluster.models import Job, JobSpec

__all__ = ["ApiError", "Client", "ClusterUnreachable", "Job", "JobSpec", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Client", "ApiError", "ClusterUnreachable"):
        from gpucluster import client

        return getattr(client, name)
    if name in ("Job", "JobSpec"):
        from gpucluster import models

        return getattr(models, name)
    raise AttributeError(name)
