"""A full or read-only data dir: a clear DataDirUnwritable, the last good state kept, and the
store writable again once space returns. Real SQLite files: a real SQLITE_FULL (the database's
page limit), a real ENOSPC (a tiny tmpfs, where this machine lets us mount one), a real EROFS (a
tmpfs remounted read-only under the head's API, then read-write again), and the translation of
injected OSErrors at the write boundary (root ignores chmod, so EACCES is injected only)."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.core.states import JobState
from gpucluster.store import DataDirUnwritable, Store
from gpucluster.store.store import unwritable

from .builders import spec
from .tmpfs import mounted_tmpfs


def _integrity(db: Path) -> str:
    with sqlite3.connect(db) as c:
        return str(c.execute("PRAGMA integrity_check").fetchone()[0])


def _cap_pages(store: Store, pages: int) -> None:
    """SQLite's own size limit: writes past it fail exactly as on a full disk (SQLITE_FULL)."""
    with store._writer.connect() as c:  # the pool's one writer connection keeps the pragma
        c.exec_driver_sql(f"PRAGMA max_page_count={pages}")


def test_a_full_database_refuses_writes_clearly_keeps_its_state_and_recovers(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    store = Store(db)
    try:
        first = store.create_job(spec(gpus=1), now=1.0)
        with store._writer.connect() as c:
            pages = int(c.exec_driver_sql("PRAGMA page_count").scalar() or 0)
        _cap_pages(store, pages)
        big = spec(gpus=1, command=["echo", *["x" * 60_000] * 4])  # needs pages the database may not grow by
        with pytest.raises(DataDirUnwritable, match=rf"the data dir {tmp_path} is full: .*free some space") as e:
            store.create_job(big, now=2.0)
        assert e.value.full
        assert [j.id for j in store.list_jobs()] == [first]
        assert store.get_job(first) is not None and store.get_job(first).state is JobState.QUEUED  # type: ignore[union-attr]
        _cap_pages(store, 1_000_000_000)  # space is back
        second = store.create_job(big, now=3.0)
        assert [j.id for j in store.list_jobs()] == [first, second]
    finally:
        store.close()
    assert _integrity(db) == "ok"


@pytest.mark.parametrize(
    ("err", "full"),
    [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EROFS, False), (errno.EACCES, False)],
)
def test_oserrors_at_the_write_boundary_become_clear_errors(tmp_path: Path, err: int, full: bool) -> None:
    store = Store(tmp_path / "state.db")
    try:
        kept = store.create_job(spec(gpus=1), now=1.0)
        with pytest.raises(DataDirUnwritable) as e, store._write() as c:
            c.exec_driver_sql("UPDATE jobs SET reason = 'half-done'")
            raise OSError(err, "injected")
        assert e.value.full is full
        assert ("is full" if full else "is read-only") in str(e.value) and str(tmp_path) in str(e.value)
        job = store.get_job(kept)
        assert job is not None and job.reason == "submitted"  # rolled back
    finally:
        store.close()


def test_other_errors_are_not_mistaken_for_a_full_or_read_only_disk(tmp_path: Path) -> None:
    assert unwritable(tmp_path, OSError(errno.EBADF, "bad fd")) is None
    assert unwritable(tmp_path, ValueError("no such column")) is None


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", "2m") as mnt:
        yield mnt


def test_a_really_full_disk_refuses_writes_and_recovers_when_space_returns(tiny_tmpfs: Path) -> None:
    db = tiny_tmpfs / "state.db"
    store = Store(db)
    filler = tiny_tmpfs / "filler"
    try:
        first = store.create_job(spec(gpus=1), now=1.0)
        # Take every free byte. Unbuffered: a buffered file's close would flush what the full
        # disk refused once more, and raise ENOSPC outside this loop (how many bytes are left
        # over depends on how big the schema made the database).
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        big = spec(gpus=1, command=["echo", *["x" * 60_000] * 4])
        with pytest.raises(DataDirUnwritable, match="is full") as e:
            for n in range(5):  # the WAL may still hold a little free room
                store.create_job(big, now=2.0 + n)
        assert e.value.full
        assert first in [j.id for j in store.list_jobs()]
        filler.unlink()  # space is back
        again = store.create_job(spec(gpus=1), now=10.0)
        assert store.get_job(again) is not None
        last = store.create_job(spec(gpus=1), now=12.0)
        assert [j.id for j in store.list_jobs()] == [first, again, last]
    finally:
        store.close()
    assert _integrity(db) == "ok"


def test_the_api_answers_a_submission_to_a_full_data_dir_with_507_and_the_reason(tmp_path: Path) -> None:
    from .headkit import api_client, make_cluster

    cluster = make_cluster(tmp_path)
    try:
        client = api_client(cluster.service)
        body = {"command": ["echo", *["x" * 60_000] * 4], "gpus": 1}
        assert client.post("/v1/jobs", json={"command": ["true"], "gpus": 1}).status_code == 201
        with cluster.store._writer.connect() as c:
            pages = int(c.exec_driver_sql("PRAGMA page_count").scalar() or 0)
        _cap_pages(cluster.store, pages)
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 507, r.text
        assert r.json()["error"].startswith(f"the data dir {tmp_path} is full: database or disk is full")
        assert len(client.get("/v1/jobs").json()["jobs"]) == 1  # reads still work: the last good state
        _cap_pages(cluster.store, 1_000_000_000)
        assert client.post("/v1/jobs", json=body).status_code == 201
    finally:
        cluster.close()


def _remount(mnt: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], capture_output=True, text=True)


@pytest.fixture
def ro_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", "16m") as mnt:
        yield mnt
        _remount(mnt, "rw")  # a failed test must not leave it read-only


def test_a_really_read_only_data_dir_answers_503_changes_nothing_and_recovers(ro_tmpfs: Path) -> None:
    """A real EROFS: the data dir's tmpfs remounted read-only under a running head (its API).

    Linux refuses to remount a filesystem read-only while a file on it is open for writing
    (EBUSY), and SQLite keeps its database open for writing: the store's connections are
    released first (Store.close(); its engines open new ones on demand, as its pools do), then
    the remount succeeds and every new connection meets the read-only filesystem."""
    from .headkit import api_client, make_cluster

    cluster = make_cluster(ro_tmpfs)
    try:
        client = api_client(cluster.service)
        first = client.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
        assert first.status_code == 201, first.text
        cluster.head.tick()
        before = client.get("/v1/jobs").json()["jobs"]
        busy = _remount(ro_tmpfs, "ro")
        assert busy.returncode != 0 and "busy" in busy.stderr, busy  # the open database holds it
        cluster.store.close()
        ro = _remount(ro_tmpfs, "ro")
        assert ro.returncode == 0, ro.stderr
        r = client.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
        assert r.status_code == 503, r.text
        assert r.json()["error"].startswith(f"the data dir {ro_tmpfs} is read-only"), r.text
        for path in ("/v1/jobs", f"/v1/jobs/{first.json()['id']}", "/v1/queue"):
            r = client.get(path)
            assert r.status_code in (200, 503), (path, r.status_code, r.text)
            if r.status_code == 503:
                assert str(ro_tmpfs) in r.json()["error"], r.text
        with pytest.raises(DataDirUnwritable, match="is read-only"):
            cluster.head.tick()
        assert _remount(ro_tmpfs, "rw").returncode == 0
        assert client.get("/v1/jobs").json()["jobs"] == before  # nothing changed meanwhile
        again = client.post("/v1/jobs", json={"command": ["true"], "gpus": 1})
        assert again.status_code == 201, again.text
        cluster.head.tick()
        ids = [j["id"] for j in client.get("/v1/jobs").json()["jobs"]]
        assert ids == [j["id"] for j in before] + [again.json()["id"]]
    finally:
        cluster.close()
    assert _integrity(ro_tmpfs / "state.db") == "ok"
