"""Every exception class the package defines derives from the one root, `GpuclusterError`,
so an embedder can catch "anything gpucluster raised" with one `except`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import gpucluster
from gpucluster.errors import GpuclusterError
from gpucluster.head.service import Rejected
from gpucluster.store.store import StoreError

_ALEMBIC = "gpucluster.store.migrations."


def _package_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(gpucluster.__path__, "gpucluster."):
        if info.name.startswith(_ALEMBIC):
            continue  # alembic's scripts, run only inside its migration context; they define no classes
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found.append(obj)
    return found


def test_every_package_exception_derives_from_the_root() -> None:
    found = _package_exceptions()
    assert len(found) >= 30  # the walk saw the package, not an empty path
    outside = sorted(f"{c.__module__}.{c.__qualname__}" for c in found if not issubclass(c, GpuclusterError))
    assert outside == []


def test_classes_keep_the_bases_callers_catch() -> None:
    assert issubclass(Rejected, ValueError) and issubclass(Rejected, GpuclusterError)
    assert issubclass(StoreError, RuntimeError) and issubclass(StoreError, GpuclusterError)
    try:
        raise Rejected("field", "bad")
    except GpuclusterError as e:
        assert str(e)
