"""Fixtures shared by the unit tests of access control, accounting and the API's rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .authkit import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A head with users alice, bob and root in their teams (authkit), closed after the test."""
    w = make_world(tmp_path)
    try:
        yield w
    finally:
        w.cluster.close()
