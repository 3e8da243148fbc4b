from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.headproc import HeadProcess


@pytest.fixture
def head_factory(tmp_path: Path) -> Iterator[type[HeadProcess]]:
    started: list[HeadProcess] = []

    class Tracked(HeadProcess):
        def start(self, timeout: float = 20.0) -> HeadProcess:
            started.append(self)
            return super().start(timeout)

    yield Tracked
    for h in started:
        h.stop()
        h.kill_jobs()


@pytest.fixture
def head(head_factory: type[HeadProcess], tmp_path: Path) -> HeadProcess:
    return head_factory(tmp_path / "data").start()
