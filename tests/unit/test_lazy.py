"""`core.lazy.Lazies`: a value worked out once per object and kept in its slot, on a frozen
slotted dataclass too; not a field (equality, `replace` and pickling read the fields alone)."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, dataclass, fields, replace

import pytest

from gpucluster.core.lazy import Lazies
from gpucluster.core.types import JobRequest

calls: list[int] = []


class _BoxLazies(Lazies):
    __slots__ = ("double",)


@dataclass(frozen=True, slots=True)
class _Box(_BoxLazies):
    x: int

    def _make_double(self) -> int:
        calls.append(self.x)
        return 2 * self.x


def test_worked_out_once_per_object_and_kept_in_its_slot() -> None:
    calls.clear()
    a, b = _Box(1), _Box(2)
    got = (a.double, a.double, b.double, a.double)  # type: ignore[attr-defined]
    assert got == (2, 2, 4, 2)
    assert calls == [1, 2]  # once per object, never again
    assert _BoxLazies.double.__get__(a) == 2  # type: ignore[attr-defined]  # in the slot itself
    assert not hasattr(a, "__dict__")  # slotted: no per-object dict
    assert replace(a, x=3).double == 6  # type: ignore[attr-defined]  # a new object works it out
    assert calls == [1, 2, 3]
    with pytest.raises(FrozenInstanceError):
        a.x = 5  # type: ignore[misc]  # still frozen
    assert a == _Box(1) and hash(a) == hash(_Box(1))  # not a field: equality reads the fields only
    assert [f.name for f in fields(a)] == ["x"]


def test_a_name_with_no_maker_is_an_attribute_error() -> None:
    box = _Box(1)
    with pytest.raises(AttributeError, match="no attribute 'triple'"):
        box.triple  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(box, "triple") and getattr(box, "__missing__", None) is None


def test_a_jobs_values_are_kept_equal_their_fields_and_are_not_pickled() -> None:
    job = JobRequest(7, 2.0, gpu_types=("H100",), team="a", cpus=4.0)
    demand = job.demand
    assert job.demand is demand and job.need is job.need and job.host is True
    assert demand == ("a", *job.need) and job.need[:2] == (2.0, ("H100",))
    copy = pickle.loads(pickle.dumps(job))
    assert copy == job and copy.demand == demand and copy.demand is not demand  # worked out again
    assert replace(job, team="b").demand == ("b", *job.need)
