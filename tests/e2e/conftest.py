"""Heads for the end-to-end tests.

`head`: the module's one shared head (`shared_head`), reset before each test (`headproc.reset`:
nothing queued or running, no node drained). Starting and stopping a head costs a few seconds
of a busy 2-core machine; one per test was a large share of the suite's time. A test on it finds
its own jobs by id and its users and teams by names no other test of the module uses; it never
counts everything on the head, and leaves the head's configuration (its policy, its flags) alone.
A module whose head needs other flags overrides `head_options`. The modules that keep the
default flags still get a head each (a fresh data dir: no module sees another's jobs, users or
learnt run times), but each is spawned while the module before it runs (`DefaultHeads`).

`fresh_head`: a head of the test's own, for a test that needs an empty head (nothing ever
submitted) or changes one for good. `head_factory`: heads a test starts (and kills, and starts
again) itself. Every head is stopped, with its jobs, when its fixture ends, even after a failure:
in the background (`headproc.stop_soon`), so the next test does not wait for the shutdown; the
session's end waits for all of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.headproc import HeadProcess, reset, stop_soon


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
            stop_soon(h)


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


def _uses_default_head(item: pytest.Item) -> bool:
    """Whether the item's module takes the conftest's shared head with the default options."""
    module = getattr(item, "module", None)
    return "shared_head" in getattr(item, "fixturenames", ()) and "head_options" not in vars(module or object)


class DefaultHeads:
    """The shared heads of the modules that keep the default `head_options`: one per module, as
    before, each spawned when the module before it takes its own, so its ~2 s start (imports,
    store, first cycle) overlaps that module's tests instead of preceding the next module's
    first one. Only where a later module in the run wants one; a head spawned for nothing (a
    deselected module, another xdist worker's) is stopped at the package's end.

    A module that sets `ITS_HEAD_STARTS_LAST = True` reads what the last `gpucluster up` wrote to
    the client config (its url:): its head is not spawned ahead (the module before may start
    heads after it), nor the next module's while it runs."""

    def __init__(self, make: Callable[[], HeadProcess], modules: list[tuple[str, bool]]) -> None:
        self._make = make
        self._modules = modules  # (name, its head starts last), in run order
        self._next: HeadProcess | None = None

    def take(self, module: str) -> HeadProcess:
        head = self._next if self._next is not None else self._make().spawn()
        self._next = None
        head.started()
        names = [name for name, _ in self._modules]
        if module in names and names.index(module) + 1 < len(names):
            _, alone = self._modules[names.index(module)]
            _, next_alone = self._modules[names.index(module) + 1]
            if not (alone or next_alone):
                self._next = self._make().spawn()
        return head

    def close(self) -> None:
        if self._next is not None:
            stop_soon(self._next)
            self._next = None


@pytest.fixture(scope="package")
def default_heads(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultHeads]:
    modules: list[tuple[str, bool]] = []
    for item in request.session.items:
        if _uses_default_head(item) and item.module.__name__ not in {name for name, _ in modules}:
            modules.append((item.module.__name__, bool(getattr(item.module, "ITS_HEAD_STARTS_LAST", False))))
    heads = DefaultHeads(lambda: HeadProcess(tmp_path_factory.mktemp("shared-head") / "data"), modules)
    try:
        yield heads
    finally:
        heads.close()


@pytest.fixture(scope="module")
def shared_head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, head_options: dict[str, Any]
) -> Iterator[HeadProcess]:
    if head_options:
        with stopped_afterwards() as tracked:
            yield tracked(tmp_path_factory.mktemp("shared-head") / "data", **head_options).start()
        return
    heads: DefaultHeads = request.getfixturevalue("default_heads")
    head = heads.take(request.module.__name__)
    try:
        yield head
    finally:
        stop_soon(head)


@pytest.fixture
def head(shared_head: HeadProcess) -> HeadProcess:
    return reset(shared_head)


@pytest.fixture
def fresh_head(head_factory: type[HeadProcess], tmp_path: Path, head_options: dict[str, Any]) -> HeadProcess:
    return head_factory(tmp_path / "data", **head_options).start()
