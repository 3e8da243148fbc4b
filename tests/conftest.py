"""Every test runs with its own client config file, never the user's ~/.config/gpucluster.

Heads started by tests write their first cluster admin's token there (one entry per head URL),
and every Client, CLI subprocess and head started by a test finds it through GPUCLUSTER_CONFIG.
Session-wide, so that module-scoped heads started before any function fixture are covered too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pgserver import (  # noqa: F401 - PostgreSQL for the store's tests
    postgres_server,
    postgres_url,
    private_postgres,
)

# The tests that start real heads, clusters, browsers and Unix accounts run one after another on
# one pytest-xdist worker (`scripts/test.sh` runs `-n 2 --dist loadgroup`), while the other worker
# takes the unit, simulator and training tests beside them. Why not all in parallel: they share
# machine-wide things (the Unix accounts test_isolation and test_containers create, Ray's
# 127.0.0.2-4, podman's storage, the cores a crash harness's timings assume), and two of them at
# once on a 2-core machine only trade wall time for flakiness; the pure tests share nothing.
SERIAL_DIRS = ("dashboard", "e2e", "fuzz", "ray")
# Elsewhere, a test that starts a real head on the wall clock says so with @pytest.mark.serial.


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: runs in order with the end-to-end tests (see SERIAL_DIRS)")
    config.addinivalue_line(
        "markers", "backends(*names): the store backends (sqlite, postgresql) a test runs on (tests/unit/conftest.py)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(tests_dir).parts if item.path.is_relative_to(tests_dir) else ()
        if (parts and parts[0] in SERIAL_DIRS) or item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group("serial"))


@pytest.fixture(scope="session", autouse=True)
def _client_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("gpucluster-config") / "config.yaml"
    saved = {k: os.environ.get(k) for k in ("GPUCLUSTER_CONFIG", "GPUCLUSTER_TOKEN")}
    os.environ["GPUCLUSTER_CONFIG"] = str(path)
    os.environ.pop("GPUCLUSTER_TOKEN", None)
    try:
        yield path
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
