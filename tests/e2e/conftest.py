from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.headproc import HeadProcess


def tracked_heads(*always: str) -> Iterator[type[HeadProcess]]:
    """A HeadProcess class whose heads all get `always` as extra arguments and are all stopped
    (with their jobs) when the fixture using it ends, even after a failure."""
    started: list[HeadProcess] = []

    class Tracked(HeadProcess):
        def __init__(self, data_dir: Path, *args: object, extra_args: tuple[str, ...] = (), **kw: object) -> None:
            super().__init__(data_dir, *args, extra_args=(*extra_args, *always), **kw)  # type: ignore[arg-type]

        def start(self, timeout: float = 20.0) -> HeadProcess:
            started.append(self)
            return super().start(timeout)

    yield Tracked
    for h in started:
        h.stop()
        h.kill_jobs()


@pytest.fixture
def head_factory() -> Iterator[type[HeadProcess]]:
    yield from tracked_heads()


@pytest.fixture
def head(head_factory: type[HeadProcess], tmp_path: Path) -> HeadProcess:
    return head_factory(tmp_path / "data").start()
