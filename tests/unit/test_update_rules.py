"""The pure rules of `gpucluster update` (head/update.py): the merge, its sentences, begin vs backoff."""

from __future__ import annotations

import pytest

from gpucluster.head.update import FieldError, describe_changes, may_set_running_limit, merged_spec, not_before_after
from gpucluster.models import JobUpdate

from .builders import spec


def change(**fields: object) -> JobUpdate:
    return JobUpdate.model_validate(fields)


def test_a_new_gpus_replaces_the_old_range_and_null_goes_back_to_the_default() -> None:
    old = spec(gpus="4..8", time_limit="1h", gpu_type="H100")
    new = merged_spec(old, change(gpus=2, time_limit=None, gpu_type=None))
    assert (new.gpus, new.min_gpus, new.time_limit, new.gpu_type) == (2, None, None, None)
    assert merged_spec(old, change(gpus="2..6")).min_gpus == 2
    assert describe_changes(old, new, {"gpus": 2, "time_limit": None}) == ["gpus 4..8 -> 2", "time limit 1h -> none"]


def test_the_merged_spec_is_refused_by_the_submits_rules_naming_the_field() -> None:
    with pytest.raises(FieldError) as e:
        merged_spec(spec(nodes=2, gpus=4), change(gpus=3))  # fine alone, not over 2 nodes: the field changed
    assert (e.value.field, e.value.message) == ("gpus", "gpus (3) must divide evenly over nodes (2)")
    with pytest.raises(FieldError, match="time_limit: time_limit must be between 1s and 366d"):
        merged_spec(spec(), change(time_limit="0s"))


def test_a_backoff_is_kept_and_a_begin_time_replaced() -> None:
    now = 1000.0
    begun = spec(begin=5000.0)
    assert not_before_after(begun, spec(begin=3000.0), 5000.0, now) == 3000.0  # was the begin time
    assert not_before_after(begun, spec(), 5000.0, now) is None
    assert not_before_after(spec(), spec(begin=2000.0), 1500.0, now) == 2000.0  # a backoff to 1500, begin later
    assert not_before_after(spec(), spec(begin=1200.0), 1500.0, now) == 1500.0  # the backoff ends later


def test_only_a_cluster_admin_extends_a_running_limit() -> None:
    one_hour = spec(time_limit="1h")
    assert may_set_running_limit(one_hour, spec(time_limit="30m"), cluster_admin=False) is None
    assert "may only be shortened (it is 1h)" in str(may_set_running_limit(one_hour, spec(time_limit="2h"), False))
    assert may_set_running_limit(spec(), spec(time_limit="2h"), False) is None  # from none: shorter
    assert "may only be shortened (it is 1h)" in str(may_set_running_limit(one_hour, spec(), False))  # to none
    assert may_set_running_limit(one_hour, spec(), cluster_admin=True) is None
