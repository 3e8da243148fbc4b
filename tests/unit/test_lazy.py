"""`core.lazy.lazy`: worked out once per object, kept on it, on a frozen dataclass too."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, replace

import pytest

from gpucluster.core.lazy import lazy
from gpucluster.core.types import JobRequest

calls: list[int] = []


@dataclass(frozen=True)
class _Box:
    x: int

    @lazy
    def double(self) -> int:
        """Twice x."""
        calls.append(self.x)
        return 2 * self.x


def test_worked_out_once_per_object_and_kept_on_it() -> None:
    calls.clear()
    a, b = _Box(1), _Box(2)
    assert (a.double, a.double, b.double, a.double) == (2, 2, 4, 2)
    assert calls == [1, 2]  # once per object, never again
    assert a.__dict__["double"] == 2
    assert replace(a, x=3).double == 6  # a new object works it out for itself
    assert calls == [1, 2, 3]
    with pytest.raises(FrozenInstanceError):
        a.x = 5  # type: ignore[misc]  # still frozen: the value went into __dict__ alone
    assert a == _Box(1)  # not a field: equality reads the fields only
    assert isinstance(_Box.double, lazy) and _Box.double.__doc__ == "Twice x."


def test_a_jobs_demand_is_kept_and_equals_its_fields() -> None:
    job = JobRequest(7, 2.0, gpu_types=("H100",), team="a")
    demand = job.demand
    assert job.demand is demand and job.need is job.__dict__["need"]
    assert demand == ("a", *job.need) and job.need[:2] == (2.0, ("H100",))
