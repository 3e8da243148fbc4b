"""The paths the CLI's commands call on the head (the connection is `gpucluster.connection`)."""

from __future__ import annotations

from urllib.parse import quote


def job_path(job_id: int, action: str = "") -> str:
    return f"/v1/jobs/{job_id}" + (f"/{action}" if action else "")


def node_path(node: str, action: str) -> str:
    return f"/v1/nodes/{quote(node, safe='')}/{action}"
