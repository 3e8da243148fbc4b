"""A job's spec parsed once while its text stays the same (store/specs.py), and never a stale one."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpucluster.core.states import JobState
from gpucluster.models import JobSpec
from gpucluster.store import Store
from gpucluster.store.specs import spec_of

from .storekit import run_sql


def test_reads_of_an_unchanged_job_share_one_parse_of_its_spec(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    try:
        job = store.create_job(JobSpec(command=["python", "train.py"], gpus=1, name="t"), 1.0)
        first, second = store.get_job(job), store.get_job(job)
        listed = store.list_jobs(ids=[job])
    finally:
        store.close()
    assert first is not None and second is not None
    # the head reads a job's record several times in its life: one validation, not one per read
    assert first.spec is second.spec is listed[0].spec
    assert first.spec.command == ["python", "train.py"]


def test_a_changed_spec_is_read_as_changed(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    try:
        job = store.create_job(JobSpec(command=["true"], gpus=1, name="before"), 1.0)
        old = store.get_job(job)
        assert old is not None and old.spec.name == "before"
        new = JobSpec(command=["true"], gpus=1, name="after")
        assert store.change_spec(job, JobState.QUEUED, new, 2.0, "renamed", was=old.spec)
        changed = store.get_job(job)
        # Another process's write too (behind this store's back): the text is the key, not the job.
        run_sql(
            tmp_path / "s.db",
            f'UPDATE jobs SET spec = replace(spec, \'"name":"after"\', \'"name":"again"\') WHERE id = {job}',
        )
        again = store.get_job(job)
    finally:
        store.close()
    assert changed is not None and changed.spec.name == "after"
    assert again is not None and again.spec.name == "again"
    assert old.spec.name == "before"  # the first read's object is left as it was


def test_a_text_that_does_not_validate_raises_at_every_read() -> None:
    bad = '{"command": [], "gpus": 1}'
    for _ in range(2):  # not kept as a success, nor as a remembered failure that hides the error
        with pytest.raises(ValidationError):
            spec_of(bad)
