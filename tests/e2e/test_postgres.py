"""End to end on PostgreSQL: real `gpucluster up --database postgresql://...` heads on the tests'
own PostgreSQL server (tests/pgserver.py).

The core tests of test_jobs.py run here again, unchanged: this module's `head_factory` gives every
head a test starts a new database of the test's own (a restarted head included), and its
`head_options` the module's shared head (`head`) a database of its own, so submit, run, cancel,
priorities, the CLI, and kill -9 with re-adoption all go through PostgreSQL. Then what only
PostgreSQL has: the database outlives any data dir, and two heads on one database are refused.
And an upgrade: a head started on a data dir written by version 1 keeps its jobs.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucluster.store import schema
from tests.e2e.conftest import tracked_heads
from tests.e2e.headproc import HeadProcess, wait_for
from tests.e2e.test_jobs import (  # noqa: F401 - collected here again, on PostgreSQL
    finished,
    running,
    test_a_job_whose_process_vanished_while_the_head_was_down_is_failed_with_the_reason,
    test_cancel_kills_the_whole_process_tree,
    test_cli_tour_submit_watch_logs_cancel_with_json,
    test_each_job_sees_only_its_own_gpus,
    test_jobs_wait_for_gpus_and_start_in_priority_then_fifo_order,
    test_kill_9_of_the_head_loses_nothing_and_runs_nothing_twice,
)
from tests.pgserver import PostgresServer

LEGACY = Path(__file__).resolve().parents[1] / "unit" / "legacy"
PY = sys.executable


@pytest.fixture
def head_factory(postgres_url: str) -> Iterator[type[HeadProcess]]:
    """Every head a test here starts (a restarted one too) on the test's PostgreSQL database."""
    yield from tracked_heads("--database", postgres_url)


@pytest.fixture(scope="module")
def head_options(postgres_server: PostgresServer) -> dict[str, Any]:
    """The module's shared head (the `head` fixture, tests/e2e/conftest.py) on a database of its own."""
    return {"extra_args": ("--database", postgres_server.create_database())}


def test_the_state_lives_in_postgresql_not_in_the_data_dir(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    first = head_factory(tmp_path / "a").start()
    assert "state in the database postgresql+psycopg://gpucluster@127.0.0.1" in first.log_path.read_text()
    with first.client() as c:
        done = c.submit([PY, "-c", "print('kept')"], gpus=1, name="kept").id
        assert finished(first, done).state.value == "succeeded"
        stopped = c.submit(["sleep", "300"], gpus=8, name="stopped").id
        running(first, stopped)
        c.cancel(stopped)
        assert finished(first, stopped).state.value == "cancelled"
    first.stop()
    assert not (tmp_path / "a" / "state.db").exists()
    # A new head with a new, empty data dir finds every job, and its history, in the database.
    second = head_factory(tmp_path / "b", port=first.port).start()
    with second.client() as c:
        jobs = {j.id: j for j in c.jobs()}
        assert jobs[done].name == "kept" and jobs[done].state.value == "succeeded"
        assert jobs[stopped].state.value == "cancelled"
        assert [e.state.value for e in c.job(stopped).events] == ["queued", "running", "cancelled"]
        assert c.submit(["true"], gpus=1).id == stopped + 1


def test_a_second_head_on_the_same_database_is_refused(
    head_factory: type[HeadProcess], postgres_url: str, tmp_path: Path
) -> None:
    head = head_factory(tmp_path / "data").start()
    r = subprocess.run(
        [PY, "-m", "gpucluster.cli.main", "up", "--data-dir", str(tmp_path / "other"), "--virtual-gpus", "2",
         "--port", "1", "--database", postgres_url],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "another gpucluster head is using the database" in r.stderr, r.stderr
    with head.client() as c:
        assert c.submit(["true"], gpus=1).id == 1  # the first head carries on


def test_a_bad_database_url_is_one_clear_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [PY, "-m", "gpucluster.cli.main", "up", "--data-dir", str(tmp_path), "--virtual-gpus", "2",
         "--database", "postgresql://nobody@127.0.0.1:1/none"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "cannot open the state database postgresql+psycopg://nobody@127.0.0.1:1/none" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_data_dir_of_version_1_upgrades_and_the_head_runs_its_jobs(tmp_path: Path) -> None:
    """SQLite: the data dir legacy/make.py wrote with the first release's store."""
    data = tmp_path / "data"
    data.mkdir()
    with sqlite3.connect(data / "state.db") as conn:
        conn.executescript((LEGACY / "v1.sql").read_text())
    shutil.copy(LEGACY / "v1.sql", tmp_path / "v1.sql")  # what it was, next to the head's log
    head = HeadProcess(data, gpus=8, gpu_type="H100-80GB")
    try:
        head.start()
        said = f"state database upgraded from schema 1 (before Alembic) to revision {schema.HEAD_REVISION}"
        assert said in head.log_path.read_text()
        with head.client() as c:
            jobs = {j.id: j for j in c.jobs()}
            assert sorted(jobs) == [1, 2, 3, 4, 5]
            assert (jobs[3].state.value, jobs[4].state.value, jobs[4].exit_code) == ("succeeded", "failed", 3)
            assert jobs[5].state.value == "cancelled" and jobs[1].name == "train"
            # Job 2 was running when version 1 stopped; its process is long gone.
            held = finished(head, 2)
            assert held.state.value == "failed" and "process lost" in held.reason
            # Job 1 (python train.py, in no workdir of ours) runs now: it fails for want of train.py.
            assert finished(head, 1).attempt == 1
            new = c.submit([PY, "-c", "print('after the upgrade')"], gpus=0.5, name="new")
            assert new.id == 6 and finished(head, 6).state.value == "succeeded"
            assert c.logs(6) == "after the upgrade\n"
            wait_for(lambda: c.job(1).state.terminal, what="job 1 to end")
    finally:
        head.stop()
        head.kill_jobs()
    with sqlite3.connect(data / "state.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(schema.HEAD_REVISION,)]
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone() == (6,)
