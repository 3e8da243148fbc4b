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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backends(*names): the store backends (sqlite, postgresql) a test runs on (tests/unit/conftest.py)"
    )


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
