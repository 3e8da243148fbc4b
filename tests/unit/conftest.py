"""Fixtures shared by the unit tests of access control, accounting and the API's rules.

`store_target`: where a test's Store lives: a SQLite file in tmp_path, or (in modules that set
`STORE_BACKENDS = ("sqlite", "postgresql")`) a new database on the session's PostgreSQL server
(tests/pgserver.py), the test running once on each. `@pytest.mark.backends("sqlite")` keeps a
test to the backends named (one that reads the SQLite file itself, say).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .authkit import World, make_world


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_target" not in metafunc.fixturenames:
        return
    backends = getattr(metafunc.module, "STORE_BACKENDS", None)
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None:
        backends = tuple(b for b in (backends or ("sqlite",)) if b in marker.args)
    if backends:
        metafunc.parametrize("store_target", backends, indirect=True)


@pytest.fixture
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """A SQLite file, or the URL of a new PostgreSQL database (see the module's docstring)."""
    if getattr(request, "param", "sqlite") == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return tmp_path / "state.db"


@pytest.fixture
def world(tmp_path: Path, store_target: Path | str) -> Iterator[World]:
    """A head with users alice, bob and root in their teams (authkit), closed after the test."""
    w = make_world(tmp_path, store_target=store_target)
    try:
        yield w
    finally:
        w.cluster.close()
