"""The one-head lease (store/lease.py) on SQLite and PostgreSQL: who may take it and when, and
that every write of a head that lost it is refused and rolled back.

Two Store objects on one database are two heads (each its own engines and connections); a
`Holder` on another host is a head whose liveness only the expiry tells.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.exc import DBAPIError

from gpucluster.core.states import JobState
from gpucluster.models import JobSpec
from gpucluster.store import DatabaseUnavailable, LeaseHeld, LeaseLost, Store
from gpucluster.store import store as store_module
from gpucluster.store.lease import Holder
from tests.pgserver import PostgresServer

from .storekit import run_sql

STORE_BACKENDS = ("sqlite", "postgresql")  # tests/unit/conftest.py

HERE = Holder("host-a", 1111, "/data/a")
THERE = Holder("host-b", 2222, "/data/b")  # another machine: alive as far as anyone can tell


def spec() -> JobSpec:
    return JobSpec(command=["true"], gpus=1)


def test_a_fresh_database_is_claimed_with_epoch_1_and_renewals_keep_it(store_target: Path | str) -> None:
    a = Store(store_target)
    try:
        lease = a.claim(HERE, duration_s=30)
        assert lease.epoch == 1 and lease.holder == HERE and lease.expires_at > lease.renewed_at
        job = a.create_job(spec(), 1.0)
        renewed = a.renew()
        assert renewed.epoch == 1 and renewed.expires_at >= lease.expires_at
        assert a.transition(job, JobState.CANCELLED, 2.0, "cancelled")
    finally:
        a.close()


def test_a_second_head_is_refused_while_the_holder_renews(store_target: Path | str) -> None:
    a, b = Store(store_target), Store(store_target)
    said: list[str] = []
    try:
        a.claim(HERE, duration_s=30)

        def holder_renews(_: float) -> None:
            a.renew()  # what the first head's loop does while the second watches

        with pytest.raises(LeaseHeld, match=r"another gpucluster head is using the database .* pid 1111 on host-a"):
            b.claim(THERE, duration_s=30, say=said.append, sleep=holder_renews)
        assert said and "leased to the head with pid 1111 on host-a" in said[0], said
        assert b.lease is None
        a.create_job(spec(), 1.0)  # the first head carries on
    finally:
        a.close()
        b.close()


def test_an_expired_lease_is_taken_over_and_every_write_of_the_old_holder_is_refused_and_rolled_back(
    store_target: Path | str,
) -> None:
    a, b = Store(store_target), Store(store_target)
    try:
        a.claim(HERE, duration_s=0.5)
        job = a.create_job(spec(), 1.0)
        started = time.monotonic()
        lease = b.claim(THERE, duration_s=30)  # waits for the expiry: the holder does not renew
        assert lease.epoch == 2 and time.monotonic() - started < 10
        # The old head wakes up: nothing it writes lands, whatever the kind of write.
        with pytest.raises(
            LeaseLost, match=r"no longer holds the database.s lease .*epoch 1.*host-b .*holds it \(epoch 2\)"
        ):
            a.transition(job, JobState.RUNNING, 2.0, "started", expect=[JobState.QUEUED])
        with pytest.raises(LeaseLost):
            a.create_job(spec(), 3.0)
        with pytest.raises(LeaseLost):
            a.renew()
        assert "epoch 1" in (a.lease_lost or "")
        assert b.get_job(job) is not None and b.get_job(job).state is JobState.QUEUED  # type: ignore[union-attr]
        assert [j.id for j in b.list_jobs()] == [job]
        a.release()  # a head that lost the lease gives nothing back: it is not its own any more
        assert b.create_job(spec(), 4.0) == job + 1
        assert b.integrity_problems() == []
    finally:
        a.close()
        b.close()


def test_a_lease_that_expired_unclaimed_is_still_its_holders(store_target: Path | str) -> None:
    """A head cut off from the database longer than the lease carries on when it returns, as
    long as no other head took over meanwhile."""
    a = Store(store_target)
    try:
        a.claim(HERE, duration_s=0.2)
        time.sleep(0.3)
        assert a.renew().epoch == 1
        a.create_job(spec(), 1.0)
    finally:
        a.close()


def test_the_next_head_on_the_same_data_dir_or_after_a_clean_stop_takes_over_at_once(
    store_target: Path | str,
) -> None:
    a, b, c = Store(store_target), Store(store_target), Store(store_target)
    try:
        a.claim(Holder("host-a", 1111, "/data/a"), duration_s=600)
        # Killed with SIGKILL; the next head on the same data dir holds the dir's lock: a is gone.
        started = time.monotonic()
        assert b.claim(Holder("host-a", 3333, "/data/a"), duration_s=600, holds_data_dir=True).epoch == 2
        assert time.monotonic() - started < 2
        b.release()  # a clean stop
        assert c.claim(THERE, duration_s=600).epoch == 3
        with pytest.raises(LeaseLost):
            b.create_job(spec(), 1.0)
    finally:
        for s in (a, b, c):
            s.close()


def test_a_holder_on_this_machine_whose_pid_is_gone_is_dead(store_target: Path | str) -> None:
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    a, b = Store(store_target), Store(store_target)
    try:
        here = Holder.this_process("/data/x")
        a.claim(Holder(here.host, gone.pid, "/data/y"), duration_s=600)
        assert b.claim(here, duration_s=600).epoch == 2  # no wait: its pid no longer exists
    finally:
        a.close()
        b.close()


def test_a_write_racing_a_takeover_either_lands_before_it_or_is_refused(store_target: Path | str) -> None:
    """Writes and takeovers are serialised by the write lock: every job the old head was told
    it created is in the database, and none it was refused is."""
    a, b = Store(store_target), Store(store_target)
    acked: list[int] = []
    refused = 0
    stop = threading.Event()

    def old_head() -> None:
        nonlocal refused
        while not stop.is_set():
            try:
                acked.append(a.create_job(spec(), 1.0))
            except LeaseLost:
                refused += 1
                return

    try:
        a.claim(HERE, duration_s=0.3)
        t = threading.Thread(target=old_head)
        t.start()
        b.claim(THERE, duration_s=30)
        t.join(30)
        stop.set()
        assert not t.is_alive() and refused == 1
        assert sorted(j.id for j in b.list_jobs()) == sorted(acked)
    finally:
        stop.set()
        a.close()
        b.close()


@pytest.mark.backends("postgresql")
def test_a_head_frozen_inside_a_write_does_not_block_the_takeover_forever(
    store_target: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head stopped (SIGSTOP, a paused VM) in the middle of a write transaction holds the one
    write lock; the server ends its idle session (store.FROZEN_WRITER_TIMEOUT_S), so the next head
    takes over once the lease expires instead of waiting on the lock for ever. Seen in the crash
    harness on a loaded machine: the second head hung silently until the test gave up."""
    monkeypatch.setattr(store_module, "FROZEN_WRITER_TIMEOUT_S", 1.0)
    a, b = Store(store_target), Store(store_target)
    frozen = a._writer.connect()
    taken: list[object] = []
    try:
        a.claim(HERE, duration_s=0.5)
        frozen.begin()  # takes the write lock (store._postgres_engine), then never goes on: frozen
        t = threading.Thread(target=lambda: taken.append(b.claim(THERE, duration_s=30)), daemon=True)
        t.start()
        t.join(120)  # a bound for a hang only: the server frees the lock after 1 s
        assert not t.is_alive(), "the second head still waits for the frozen head's write lock"
        assert len(taken) == 1 and b.lease is not None and b.lease.epoch == 2
        with pytest.raises(DBAPIError):  # the frozen head's transaction was ended by the server
            frozen.exec_driver_sql("SELECT 1")
        with pytest.raises(LeaseLost):  # and once awake, it writes nothing
            a.create_job(spec(), 1.0)
        assert b.create_job(spec(), 2.0) >= 1
    finally:
        with contextlib.suppress(DBAPIError):
            frozen.close()
        a.close()
        b.close()


@pytest.mark.backends("sqlite")
def test_the_lease_is_a_row_in_meta(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    a = Store(db)
    try:
        a.claim(HERE, duration_s=30)
        [[(value,)]] = run_sql(db, "SELECT value FROM meta WHERE key = 'head_lease'")
        assert '"epoch": 1' in value and '"host": "host-a"' in value
    finally:
        a.close()


def test_an_unreachable_database_is_one_clear_error_logged_once_and_the_store_resumes(
    private_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = private_postgres.create_database()
    store = Store(url)
    try:
        store.claim(HERE, duration_s=600)
        job = store.create_job(spec(), 1.0)
        private_postgres.shutdown()
        caplog.set_level(logging.WARNING, logger="gpucluster.store")
        for call in (lambda: store.get_job(job), lambda: store.create_job(spec(), 2.0), store.renew):
            with pytest.raises(DatabaseUnavailable, match=r"^database unavailable: \S"):
                call()
        warned = [r.getMessage() for r in caplog.records if r.name == "gpucluster.store"]
        assert len(warned) == 1 and warned[0].startswith("database unavailable:"), warned
        assert all(r.exc_info is None for r in caplog.records), "no traceback in the log"
        private_postgres.start_again()
        assert store.renew().epoch == 1  # the lease survived the restart: it is a row
        assert store.get_job(job) is not None
        assert store.create_job(spec(), 3.0) == job + 1
        back = [r.getMessage() for r in caplog.records if r.name == "gpucluster.store"][1:]
        assert len(back) == 1 and back[0].startswith("database available again after"), back
    finally:
        store.close()
