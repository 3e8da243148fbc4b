"""The `gpucluster` command line.

In the CLI's own process (the `gpucluster` script, or `python -m gpucluster.cli...`), two imports
that the CLI never uses are refused before anything imports httpx: httpcore imports `trio` when
it is installed (~65 ms of CPU, for async clients only; the CLI is synchronous), and httpx its
own command line (`httpx._main`: click, pygments; it falls back when that import fails). People
run read commands in loops and under `watch`, so each one must start in a blink (issue 19). A
program that imports the SDK (`gpucluster.Client`) or these modules is not affected.
"""

from __future__ import annotations

import os
import sys


def _is_cli_process() -> bool:
    # `python -m gpucluster.cli.main` imports this package while argv[0] is still "-m".
    return os.path.basename(sys.argv[0]) == "gpucluster" or sys.argv[0] == "-m" if sys.argv else False


if _is_cli_process():
    for _unused in ("trio", "httpx._main"):
        sys.modules.setdefault(_unused, None)  # type: ignore[arg-type]  # then `import` raises ImportError
