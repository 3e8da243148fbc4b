"""Start and stop a real `gpucluster up` process for end-to-end tests.

Everything started is stopped by PID even when a test fails: the head itself, and every job
process group recorded by the job shims under the data dir (one per rank for a distributed job).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from gpucluster import userconfig
from gpucluster.client import ApiError, Client
from gpucluster.core.states import JobState
from gpucluster.launch.ranks import pick_free_port

CLI = [sys.executable, "-m", "gpucluster.cli.main"]


@contextlib.contextmanager
def passable_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory other accounts may pass through (as /var/lib is), removed afterwards: a
    root head's data dir for jobs run as other Unix accounts (pytest's tmp dirs are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    """A loopback port held for the server a test starts next (see `pick_free_port`: a port merely
    found free could be taken by another process's bind or connect before that server binds it)."""
    return pick_free_port("127.0.0.1")


# Every wait here is for an event (a state, a file, a log line); its deadline only bounds a hang,
# and pytest-timeout (pyproject) bounds the test. A deadline a test names is what an idle machine
# needs; on a machine whose cores are busy with other work (a shared CI runner, a suite next to
# `stress-ng --cpu 2`) a head, a job or torch takes several times longer, so every deadline is
# stretched by this factor: a wait that would have passed later no longer fails (issue 19).
SLACK = float(os.environ.get("GPUCLUSTER_TEST_SLACK", "4"))


class HeadProcess:
    def __init__(
        self,
        data_dir: Path,
        gpus: int = 8,
        gpu_type: str = "H100-80GB",
        grace: str = "1s",
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.tls = "--tls-cert" in extra_args
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "gpucluster.cli.main",
            "up",
            "--port",
            str(self.port),
            "--data-dir",
            str(data_dir),
            "--virtual-gpus",
            str(gpus),
            "--gpu-type",
            gpu_type,
            "--grace-period",
            grace,
            "--node-name",
            "node0",
            *extra_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"head-{self.port}.log"

    def start(self, timeout: float = 20.0) -> HeadProcess:
        return self.spawn().started(timeout)

    def spawn(self) -> HeadProcess:
        """Start the head's process without waiting for it to serve (`started` waits): a head
        wanted later starts while the tests before it run (tests/e2e/conftest.py)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self

    def started(self, timeout: float = 20.0) -> HeadProcess:
        """Return once the spawned head serves; raise with its log if it exits or never does."""
        proc = self.proc
        assert proc is not None, "spawn() first"
        return self.await_health(
            timeout * SLACK,  # see SLACK: a head on busy cores starts slower
            lambda: None if proc.poll() is None else f"head exited with {proc.returncode}: {self.log_path.read_text()}",
        )

    def await_health(
        self, timeout: float, exited: Callable[[], str | None], interval: float = 0.05, log_chars: int | None = None
    ) -> HeadProcess:
        """Return once the head answers its health check; raise with `exited()`'s message as soon
        as that says the head is gone, or with its log after `timeout` seconds. One client for all
        the polls: httpx.get builds a client (and its TLS context) per call, ~20 ms of CPU each,
        taken from the head starting beside it on a 2-core machine."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1, verify=not self.tls) as http:
            while time.monotonic() < deadline:
                gone = exited()
                if gone is not None:
                    raise RuntimeError(gone)
                try:
                    if http.get(f"{self.url}/v1/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(interval)
        log = self.log_path.read_text()
        raise RuntimeError(f"head did not come up: {log if log_chars is None else log[-log_chars:]}")

    def client(self) -> Client:
        return Client(self.url, token=self.token)

    @property
    def token(self) -> str | None:
        """The head's first cluster admin token, which it wrote to $GPUCLUSTER_CONFIG (tests/conftest.py)."""
        return userconfig.load().token_for(self.url)

    @property
    def headers(self) -> dict[str, str]:
        """For raw httpx calls: the admin token."""
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def env(self) -> dict[str, str]:
        """The environment for a `gpucluster` CLI subprocess talking to this head as its admin."""
        return {**os.environ, "GPUCLUSTER_URL": self.url}

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def job_pgids(self) -> list[int]:
        out = []
        shims = [
            *self.data_dir.glob("run/*/attempt-*/shim.json"),
            *self.data_dir.glob("run/*/attempt-*/rank-*/shim.json"),
        ]
        for f in shims:
            with contextlib.suppress(ValueError, KeyError, OSError):
                record = json.loads(f.read_text())
                out += [int(record["pgid"]), int(record["job_pgid"])]  # the shim's keeper; the job
        return out

    def kill_jobs(self) -> None:
        for pgid in self.job_pgids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        # Distributed jobs' processes that left their group (torchrun's workers) carry their
        # attempt's directory in their environment.
        needle = f"\0GPUCLUSTER_ATTEMPT_DIR={self.data_dir}/".encode()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    environ = b"\0" + f.read()
            except OSError:
                continue
            if needle in environ:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)


# Heads being stopped in the background (`stop_soon`), joined by `finish_stops`.
_stopping: list[threading.Thread] = []


def _stop_and_kill(head: HeadProcess) -> None:
    head.stop()
    head.kill_jobs()


def stop_soon(head: HeadProcess) -> None:
    """Stop the head, then kill its jobs, in a thread: a head takes ~0.75 s of a busy 2-core
    machine to shut down (0.3 s of it CPU), which the next test need not wait for. Nothing is
    left running: `finish_stops` (the session's end, tests/conftest.py) waits for every one."""
    thread = threading.Thread(target=_stop_and_kill, args=(head,), name=f"stop-head-{head.port}")
    thread.start()
    _stopping.append(thread)


def finish_stops() -> None:
    """Wait until every head `stop_soon` was given has exited and its jobs are killed."""
    while _stopping:
        _stopping.pop().join()


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout * SLACK
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last value {last!r}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cli(
    head: HeadProcess,
    *args: str,
    token: str | None = None,
    cwd: Path | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """The real `gpucluster` CLI in a process of its own, talking to `head` as its admin, or as
    the holder of `token`; never raises on a failing command (tests assert on its exit code)."""
    env = head.env
    if token is not None:
        env["GPUCLUSTER_TOKEN"] = token
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False)


def reset(head: HeadProcess) -> HeadProcess:
    """Make a head that earlier tests used look idle to the next one: no job queued, held or
    running (each cancelled and waited for until it ended, so every GPU is free), no node
    drained. Earlier tests' ended jobs, users and teams stay: a test on a shared head finds its
    own jobs by id and its own users by name, never by counting everything (tests/e2e/conftest.py).
    A head a test killed is started again on its data dir and port."""
    assert head.proc is not None
    if head.proc.poll() is not None:
        head.start()
    with head.client() as c:
        for node in c.nodes():
            if node.drained:
                c.undrain(node.name)
        live = [j.id for j in c.jobs(state=[s.value for s in JobState if not s.terminal])]
        for job_id in live:
            with contextlib.suppress(ApiError):  # an array element ended with its array, or just ended
                c.cancel(job_id)
        wait_for(lambda: all(c.job(i).state.terminal for i in live), 60, what=f"earlier tests' jobs {live} to end")
        wait_for(
            lambda: not any(g.job_id is not None for n in c.nodes() for g in n.gpus),
            60,
            what="every GPU to be free",
        )
    return head
