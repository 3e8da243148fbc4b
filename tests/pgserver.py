"""A private PostgreSQL server for the tests: Debian's binaries, a fresh cluster in a temp dir
(in /dev/shm, memory, where there is one), listening on a free loopback port only (no Unix socket),
trust authentication.

initdb and postgres refuse to run as root: under root (CI) the server runs as the `postgres`
account the Debian package creates (or `nobody`), owning its temp dir. It is stopped by its PID
(the postmaster's fast shutdown, SIGKILL if that hangs) when the session ends, however it ends.

`postgres_server` (session) starts it once; `postgres_url` (per test) creates a new, empty
database on it and gives its URL, so tests never see each other's rows or advisory locks.
`private_postgres` (per test) starts a server of the test's own, which the test may stop and
start again (`shutdown`, `start_again`: a database outage, a restart) without disturbing others.
Without the binaries the tests that need it are skipped, saying how to install them; under
CI=true they fail instead, so CI can never pass by not testing PostgreSQL.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpucluster.launch.ranks import pick_free_port

SUPERUSER = "gpucluster"
INSTALL_HINT = "apt-get install postgresql (scripts/test.sh does it when run as root)"


def find_bindir() -> Path | None:
    """The newest installed server's bin dir (Debian: /usr/lib/postgresql/N/bin), or from PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class PostgresServer:
    bindir: Path
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    _counter: itertools.count[int]
    argv: tuple[str, ...] = ()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t{next(self._counter)}_{os.getpid()}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')  # type: ignore[arg-type]
        return self.url(name)

    def shutdown(self) -> None:
        """Stop the server, keeping its data: an outage. Clients are disconnected (fast shutdown)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def start_again(self, timeout: float = 30.0) -> None:
        """Start the stopped server on the same data and port (the outage is over)."""
        assert self.proc.poll() is not None and self.argv, "the server is still running"
        with open(self.root / "server.log", "ab") as out:
            self.proc = subprocess.Popen(
                list(self.argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **_run_as(),  # type: ignore[arg-type]
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if _ready(self):
                return
            time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL did not start again: {(self.root / 'server.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients, checkpoint, exit
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def _run_as() -> dict[str, int]:
    """Popen's user/group arguments: a non-root account when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pw = pwd.getpwnam(name)
            return {"user": pw.pw_uid, "group": pw.pw_gid}
    raise RuntimeError("running as root and no postgres or nobody account to run PostgreSQL as")


def _memory_dir() -> str | None:
    """/dev/shm where there is one (a tmpfs): the server's files in memory. A session's server
    holds a new ~8 MB database per test; on a disk, removing the hundreds of MB of a unit run's
    databases and WAL at the end took 35-100 s of a loaded machine, against well under a second
    here. Nothing in it must outlive the session (fsync is off anyway)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def start_server(bindir: Path) -> PostgresServer:
    who = _run_as()
    root = Path(tempfile.mkdtemp(prefix="gpucluster-pg-", dir=_memory_dir()))
    data = root / "data"
    if who:
        os.chown(root, who["user"], who["group"])
    log = root / "server.log"
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            **who,  # type: ignore[arg-type]
        )
    except subprocess.CalledProcessError as e:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {e.stderr.decode(errors='replace')}") from None
    for _ in range(5):
        port = pick_free_port("127.0.0.1")  # held from other picks until postgres binds it
        with open(log, "ab") as out:
            # No Unix socket (-k ""): loopback TCP only. fsync off: a test server, nothing in it
            # must survive a power cut (commits are still synchronous towards the server).
            settings = {"fsync": "off", "full_page_writes": "off", "max_connections": "200", "shared_buffers": "32MB"}
            argv = [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1", "-k", ""]
            argv += [arg for k, v in settings.items() for arg in ("-c", f"{k}={v}")]
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **who,  # type: ignore[arg-type]
            )
        server = PostgresServer(bindir, root, port, proc, itertools.count(1), tuple(argv))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                if _ready(server):
                    return server
            time.sleep(0.1)
        server.stop() if proc.poll() is None else None
        if "could not bind" not in log.read_text(errors="replace"):
            break
    text = log.read_text(errors="replace")
    shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"PostgreSQL did not start: {text[-2000:]}")


def _ready(server: PostgresServer) -> bool:
    import psycopg

    try:
        with psycopg.connect(server.url(), connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def unavailable(why: str) -> None:
    """Skip, or under CI fail: CI must test PostgreSQL, never pass by skipping it."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def _serving() -> Iterator[PostgresServer]:
    """A server of Debian's binaries in a temp dir, stopped afterwards; a skip (a failure on CI)
    where there are none."""
    bindir = find_bindir()
    if bindir is None:
        unavailable(f"no PostgreSQL server binaries (initdb, postgres) on this machine: {INSTALL_HINT}")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed: pip install -e '.[test]'")
    assert bindir is not None
    try:
        server = start_server(bindir)
    except (RuntimeError, OSError) as e:
        unavailable(f"could not start a PostgreSQL server from {bindir}: {e}")
        raise
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    yield from _serving()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A new, empty database on the session's server."""
    return postgres_server.create_database()


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, to stop and start again; stopped after the test."""
    yield from _serving()
