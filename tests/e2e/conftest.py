"""Heads for the end-to-end tests.

`head`: the module's one shared head (`shared_head`), reset before each test (`headproc.reset`:
nothing queued or running, no node drained). Starting and stopping a head costs a few seconds
of a busy 2-core machine; one per test was a large share of the suite's time. A test on it finds
its own jobs by id and its users and teams by names no other test of the module uses; it never
counts everything on the head, and leaves the head's configuration (its policy, its flags) alone.
A module whose head needs other flags overrides `head_options`.

`fresh_head`: a head of the test's own, for a test that needs an empty head (nothing ever
submitted) or changes one for good. `head_factory`: heads a test starts (and kills, and starts
again) itself. Every head is stopped, with its jobs, when its fixture ends, even after a failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.headproc import HeadProcess, reset


@contextlib.contextmanager
def stopped_afterwards(*always: str) -> Iterator[type[HeadProcess]]:
    """A HeadProcess class whose heads all get `always` as extra arguments and are all stopped
    (with their jobs) when the block ends, even after a failure."""
    started: list[HeadProcess] = []

    class Tracked(HeadProcess):
        def __init__(self, data_dir: Path, *args: object, extra_args: tuple[str, ...] = (), **kw: object) -> None:
            super().__init__(data_dir, *args, extra_args=(*extra_args, *always), **kw)  # type: ignore[arg-type]

        def start(self, timeout: float = 20.0) -> HeadProcess:
            if self not in started:
                started.append(self)
            return super().start(timeout)

    try:
        yield Tracked
    finally:
        for h in started:
            h.stop()
            h.kill_jobs()


def tracked_heads(*always: str) -> Iterator[type[HeadProcess]]:
    """`stopped_afterwards` as a fixture's body (`yield from tracked_heads(...)`)."""
    with stopped_afterwards(*always) as tracked:
        yield tracked


@pytest.fixture
def head_factory() -> Iterator[type[HeadProcess]]:
    yield from tracked_heads()


@pytest.fixture(scope="module")
def head_options() -> dict[str, Any]:
    """HeadProcess's keyword arguments for this module's shared head; a module overrides this
    fixture (module-scoped) to give its head other GPUs, flags or a database."""
    return {}


@pytest.fixture(scope="module")
def shared_head(tmp_path_factory: pytest.TempPathFactory, head_options: dict[str, Any]) -> Iterator[HeadProcess]:
    with stopped_afterwards() as tracked:
        yield tracked(tmp_path_factory.mktemp("shared-head") / "data", **head_options).start()


@pytest.fixture
def head(shared_head: HeadProcess) -> HeadProcess:
    return reset(shared_head)


@pytest.fixture
def fresh_head(head_factory: type[HeadProcess], tmp_path: Path, head_options: dict[str, Any]) -> HeadProcess:
    return head_factory(tmp_path / "data", **head_options).start()
