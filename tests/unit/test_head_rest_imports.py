"""The head at rest does not load what only services need (issue 18: its memory at rest).

`import httpx` also imports its command line's rich and pygments (4.9 MiB); the service gateway
and the replicas' probes import it on first use, so a head whose cluster runs no service never
does. A fresh interpreter, as `gpucluster up` starts one."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import gpucluster.cli.main, gpucluster.head.server, gpucluster.services.gateway, gpucluster.services.reconciler
print(",".join(m for m in ("httpx", "rich", "pygments") if m in sys.modules))
"""


def test_the_head_and_its_service_parts_import_no_http_client() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "", done.stdout
