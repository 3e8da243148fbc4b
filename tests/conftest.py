"""Every test runs with its own client config file, never the user's ~/.config/gpucluster.

Heads started by tests write their first cluster admin's token there (one entry per head URL),
and every Client, CLI subprocess and head started by a test finds it through GPUCLUSTER_CONFIG.
Session-wide, so that module-scoped heads started before any function fixture are covered too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Check mode, always on in tests: every plan of every head (in process, or a `gpucluster up` a
# test starts, which inherits this) first compares its event-fed cluster state with a fresh build
# from the store and fails on a difference (head/loop.py, core/cluster_state.py; issue 15).
os.environ["GPUCLUSTER_CHECK_STATE"] = "1"

from tests.pgserver import (  # noqa: F401 - PostgreSQL for the store's tests
    postgres_server,
    postgres_url,
    private_postgres,
)

# No per-example deadline for property tests (Hypothesis' default is 200 ms): on a 2-core machine
# the rest of the suite, CI or a helper shares, one example of a scheduler property took longer,
# and that failed a test whose property held. A hang still fails one test (pytest-timeout).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# scripts/test.sh runs the pure tests on two workers, then the serial ones alone (`--part`,
# `suite_part`). A plain `pytest -n 2` over both still keeps the tests that start real heads,
# clusters, browsers and Unix accounts one after another on one worker, while the other takes
# the unit, simulator and training tests beside them. Why not all in parallel: they
# share machine-wide things (the Unix accounts test_isolation and test_containers create, Ray's
# 127.0.0.2-4, podman's storage, the cores a crash harness's timings assume), and two of them at
# once on a 2-core machine only trade wall time for flakiness; the pure tests share nothing.
SERIAL_DIRS = ("dashboard", "e2e", "fuzz", "ray")
# Elsewhere, the tests that start a real head on the wall clock (by node id, without parameters).
SERIAL_TESTS = frozenset(
    {
        # its decisions hold only for start delays under 0.35 s
        "tests/sim/test_live_head.py::test_simulator_and_live_head_take_the_same_decisions",
    }
)


def serial_scope(nodeid: str) -> str | None:
    """ "serial" for a test that must run in order with the end-to-end ones, else None."""
    parts = nodeid.split("/", 2)
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in SERIAL_DIRS:
        return "serial"
    return "serial" if nodeid.split("[", 1)[0] in SERIAL_TESTS else None


# The training runs of tests/train (real gloo groups, torchrun's restarts): not "serial" beside
# the pure tests under GPUCLUSTER_TEST_WORKERS, but run with the serial ones by `--part serial`.
TRAINING_DIR = "tests/train/"


def suite_part(nodeid: str) -> str:
    """Which part of scripts/test.sh's two runs a test belongs to: "pure" (unit and simulator
    tests that start nothing machine-wide: they run on two workers at once) or "serial" (real
    heads, clusters, browsers, Unix accounts, Ray, training runs: one after another, alone)."""
    return "serial" if serial_scope(nodeid) or nodeid.startswith(TRAINING_DIR) else "pure"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        choices=("all", "pure", "serial"),
        default="all",
        help="run only the pure tests or only the serial ones (scripts/test.sh runs both, in turn)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--part`: deselect the tests of the other part (`suite_part`)."""
    part = config.getoption("--part")
    if part == "all":
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (keep if suite_part(item.nodeid) == part else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler: work units are test modules (as `--dist loadscope`), but every
    serial test is one unit, so one worker runs them all in collection order. (Its own
    `--dist loadgroup` with `xdist_group` marks did not group anything under pytest 9.2.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SerialBesidePure(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return serial_scope(nodeid) or str(super()._split_scope(nodeid))

    return SerialBesidePure(config, log)


def _compile_the_package() -> None:
    """Write the bytecode of every gpucluster module once, before any test starts a process.

    Each `gpucluster up`, CLI call and job rank the tests start is a fresh interpreter. Where
    bytecode is not written (PYTHONDONTWRITEBYTECODE, as on this project's CI machine, and a fresh
    clone has none), every one of them compiled the package's modules from source again: ~0.25 s
    of CPU per head start, ~0.03 s per CLI call, hundreds of times a run. Compiled here once
    (~0.4 s), into the package's own (git-ignored) __pycache__, they only read it; Python checks
    each file against its source, so an edited module is compiled afresh as before.
    """
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("gpucluster")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        compileall.compile_dir(location, quiet=1)


def pytest_configure(config: pytest.Config) -> None:
    _compile_the_package()
    config.addinivalue_line(
        "markers", "backends(*names): the store backends (sqlite, postgresql) a test runs on (tests/unit/conftest.py)"
    )


@pytest.fixture(scope="session", autouse=True)
def _heads_stopped() -> Iterator[None]:
    """The session ends only once every head stopped in the background (tests/e2e/headproc.py's
    `stop_soon`) has exited and its jobs are killed."""
    yield
    headproc = sys.modules.get("tests.e2e.headproc")  # none to wait for where no test imported it
    if headproc is not None:
        headproc.finish_stops()


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
