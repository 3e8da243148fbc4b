"""The fork server (executors/_shim.py `serve`, local.py `ForkServer`): keepers forked per job keep
every promise of an exec'd shim. Real processes throughout: the server, the keepers it forks, a head
process killed with SIGKILL, a job's fds and environment read from /proc by the job itself."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpucluster.executors import _shim, cgroups, local
from gpucluster.executors.base import Exited, Handle, LaunchError, LaunchSpec, Running
from gpucluster.executors.local import SHIM_ENV, LocalExecutor, write_shim_spec
from tests.e2e.headproc import passable_dir, pid_alive, wait_for

SRC = str(Path(__file__).resolve().parents[2] / "src")
# A job that runs until the test creates GO in its workdir, then ends with code 3: nothing in it
# depends on how fast the machine is.
WAIT_FOR_GO = "while [ ! -e GO ]; do sleep 0.05; done; exit 3"


def job(tmp: Path, job_id: int, script: str, env: dict[str, str] | None = None) -> LaunchSpec:
    return LaunchSpec(
        job_id=job_id,
        attempt=1,
        argv=["sh", "-c", script],
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        workdir=str(tmp),
        run_dir=tmp / "run" / str(job_id),
        log_path=tmp / "jobs" / str(job_id) / "output.log",
    )


def ended(executor: LocalExecutor, handle: Handle, timeout: float = 30) -> Exited:
    def done() -> object:
        status = executor.poll(handle)
        return None if isinstance(status, Running) else status

    status = wait_for(done, timeout, what="the job's end")
    assert isinstance(status, Exited), status
    return status


@pytest.fixture
def executor() -> Iterator[LocalExecutor]:
    ex = LocalExecutor()
    yield ex
    ex.close()


def test_a_job_starts_through_the_fork_server_not_an_exec(executor: LocalExecutor, tmp_path: Path) -> None:
    handle = executor.launch(job(tmp_path, 1, "exit 0"))
    assert executor.fork_server is not None and executor.fork_server.pid is not None
    # Not this process's child (an exec'd shim is): forked by the server.
    assert int(handle["pid"]) not in executor._children
    assert ended(executor, handle).exit_code == 0
    assert json.loads((tmp_path / "run" / "1" / "exit.json").read_text())["exit_code"] == 0
    # The keeper leads its own process group, as an exec'd shim does (a head kills jobs it cannot
    # signal otherwise by it): not a group led by a short-lived process of the server's.
    record = json.loads((tmp_path / "run" / "1" / "shim.json").read_text())
    assert record["pgid"] == record["pid"] == handle["pid"]
    # Reaped by the server: no zombie is left, whoever this node's PID 1 is.
    wait_for(lambda: not os.path.exists(f"/proc/{handle['pid']}"), what="the ended keeper to be reaped")


def test_a_job_outlives_a_sigkill_of_the_fork_server_and_its_exit_is_recorded(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    handle = executor.launch(job(tmp_path, 1, WAIT_FOR_GO))
    wait_for(lambda: (tmp_path / "run" / "1" / "shim.json").exists(), what="the keeper's record")
    server = executor.fork_server.pid if executor.fork_server is not None else None
    assert server is not None
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not pid_alive(server), what="the server's end")
    assert isinstance(executor.poll(handle), Running)
    (tmp_path / "GO").touch()
    status = ended(executor, handle)
    assert (status.exit_code, status.signal) == (3, None)


def test_the_fork_server_is_started_again_after_it_died(executor: LocalExecutor, tmp_path: Path) -> None:
    first = executor.launch(job(tmp_path, 1, "exit 0"))
    assert executor.fork_server is not None
    server = executor.fork_server.pid
    assert server is not None
    ended(executor, first)
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not pid_alive(server), what="the server's end")
    second = executor.launch(job(tmp_path, 2, "exit 4"))
    assert executor.fork_server.pid not in (None, server)
    assert int(second["pid"]) not in executor._children  # forked by the new server, not exec'd
    assert ended(executor, second).exit_code == 4


def test_a_forked_job_inherits_no_fd_and_only_its_own_environment(executor: LocalExecutor, tmp_path: Path) -> None:
    """The head's (this process's) inheritable fd and its variables, and the server's pipes, reach
    neither the keeper nor the job."""
    leak_r, leak_w = os.pipe()
    os.set_inheritable(leak_r, True)
    os.set_inheritable(leak_w, True)
    os.environ["GPUCLUSTER_TEST_SECRET"] = "s3cret"
    try:
        report = "import os, json; json.dump([os.listdir('/proc/self/fd'), dict(os.environ)], open('seen', 'w'))"
        spec = job(tmp_path, 1, f'{sys.executable} -I -S -c "{report}"; ' + WAIT_FOR_GO, {"MINE": "1"})
        handle = executor.launch(spec)
        keeper = int(handle["pid"])
        wait_for(lambda: (tmp_path / "seen").exists() and (tmp_path / "seen").read_text(), what="the job's report")
        keeper_env = Path(f"/proc/{keeper}/environ").read_bytes().split(b"\0")
        keeper_fds = {os.readlink(f"/proc/{keeper}/fd/{fd}") for fd in os.listdir(f"/proc/{keeper}/fd")}
        (tmp_path / "GO").touch()
        assert ended(executor, handle).exit_code == 3
    finally:
        del os.environ["GPUCLUSTER_TEST_SECRET"]
        os.close(leak_r)
        os.close(leak_w)
    # The job's process holds stdin, stdout, stderr, and the directory it lists them through, plus
    # the file it writes them to: none of the head's fds, nor the server's.
    fds, env = json.loads((tmp_path / "seen").read_text())
    assert len(fds) <= 5 and {"0", "1", "2"} <= set(fds), fds
    assert "GPUCLUSTER_TEST_SECRET" not in env
    assert env["MINE"] == "1"
    # (LC_CTYPE: set by the reporting Python itself, PEP 538)
    assert set(env) <= {"PATH", "MINE", "HOME", "USER", "LOGNAME", "PWD", "SHLVL", "_", "LC_CTYPE"}
    assert {kv.decode() for kv in keeper_env if kv} == {f"{k}={v}" for k, v in SHIM_ENV.items()}
    # The keeper holds /dev/null, its shim.log and its job side's report pipe: no pipe of the
    # server's (to the head) and nothing of the head's.
    run_dir = tmp_path / "run" / "1"
    assert {fd for fd in keeper_fds if not fd.startswith("pipe:")} <= {os.devnull, str(run_dir / "shim.log")}
    assert sum(fd.startswith("pipe:") for fd in keeper_fds) <= 1


HEAD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from gpucluster.executors.base import LaunchSpec
    from gpucluster.executors.local import LocalExecutor
    tmp = Path(sys.argv[1])
    ex = LocalExecutor()
    spec = LaunchSpec(1, 1, ["sh", "-c", sys.argv[2]], {"PATH": "/usr/bin:/bin"}, str(tmp), tmp / "run" / "1",
                      tmp / "jobs" / "1" / "output.log")
    handle = ex.launch(spec)
    print(json.dumps({"handle": handle, "server": ex.fork_server.pid}), flush=True)
    sys.stdin.read()  # until the test kills this head
    """
)


def test_a_forked_job_survives_a_sigkill_of_its_head_and_the_next_head_adopts_it(tmp_path: Path) -> None:
    """The head (a process of its own) is SIGKILLed mid-job; its fork server ends with it (no
    leftover), the job runs on, ends while no head is up, and the next head's executor finds it
    from the run dir (`recover`) and reads how it ended."""
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD, str(tmp_path), WAIT_FOR_GO],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    try:
        assert head.stdout is not None
        started = json.loads(head.stdout.readline())
        keeper, server = int(started["handle"]["pid"]), int(started["server"])
        wait_for(lambda: (tmp_path / "run" / "1" / "shim.json").exists(), what="the keeper's record")
        head.kill()
        head.wait()
        wait_for(lambda: not pid_alive(server), what="the fork server's end with its head")
        assert pid_alive(keeper)
        (tmp_path / "GO").touch()
        wait_for(lambda: (tmp_path / "run" / "1" / "exit.json").exists(), what="the exit record, no head up")
        executor = LocalExecutor()
        try:
            handle = executor.recover(tmp_path / "run" / "1")
            assert handle is not None and int(handle["pid"]) == keeper
            status = ended(executor, handle)
            assert (status.exit_code, status.signal) == (3, None)
        finally:
            executor.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            head.kill()
        head.wait()
        (tmp_path / "GO").touch()  # a job a failed test left waiting ends by itself


def test_a_keeper_whose_run_dir_was_removed_ends_instead_of_retrying_its_record(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    """A forked keeper has no waiting parent, so it retries a record it cannot write (a full disk)
    until it can; found running for ever after a test removed its attempt's directory: a record
    there can never be read, so it stops."""
    handle = executor.launch(job(tmp_path, 1, WAIT_FOR_GO))
    run_dir = tmp_path / "run" / "1"
    wait_for(lambda: (run_dir / "shim.json").exists(), what="the keeper's record")
    keeper = int(handle["pid"])
    for f in run_dir.iterdir():
        f.unlink()
    run_dir.rmdir()
    (tmp_path / "GO").touch()
    wait_for(lambda: not pid_alive(keeper), what="the keeper's end")


def test_a_keeper_whose_pid_never_reached_the_head_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server forked a keeper but could not hand its pid to the head (the head's pipe broke,
    or the server was killed in between): the keeper ends without starting the job, so a head
    that retries the start never runs it twice. `_spawn` runs here, in this process (its fork
    is this test's child)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_shim_spec(
        run_dir, argv=["sh", "-c", "echo ran > RAN"], env={"PATH": "/usr/bin:/bin"}, workdir=str(tmp_path),
        log=tmp_path / "output.log",
    )  # fmt: skip
    to_head, replies = os.pipe()
    real_write = os.write
    lost: list[bytes] = []

    def head_gone(fd: int, data: bytes) -> int:
        if fd == replies:
            lost.append(data)
            raise BrokenPipeError(32, "the head is gone")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", head_gone)
    try:
        with pytest.raises(BrokenPipeError):
            _shim._spawn(str(run_dir), replies)
    finally:
        monkeypatch.undo()
        os.close(to_head)
        os.close(replies)
    _, status = os.waitpid(int(lost[0].split()[0]), 0)  # the keeper: this process's child
    assert os.waitstatus_to_exitcode(status) == 0
    assert not (tmp_path / "RAN").exists() and not (run_dir / "exit.json").exists()
    assert not (run_dir / "shim.json").exists()


def test_a_keeper_makes_its_shim_log_only_when_it_fails(executor: LocalExecutor, tmp_path: Path) -> None:
    """Issue 18: no shim.log per job start (a file creation each), yet a keeper that fails still
    says why there (here: a spec it cannot read)."""
    handle = executor.launch(job(tmp_path, 1, "echo out; echo err >&2; exit 0"))
    assert ended(executor, handle).exit_code == 0
    run_dir = tmp_path / "run" / "1"
    assert (tmp_path / "jobs" / "1" / "output.log").read_text() == "out\nerr\n"
    assert not (run_dir / "shim.log").exists()
    broken = tmp_path / "run" / "2"
    broken.mkdir(parents=True)
    (broken / "spec.json").write_text("{not json")
    assert executor.fork_server is not None
    started = executor.fork_server.start(broken)
    assert started is not None
    logged = wait_for(lambda: (broken / "shim.log").exists() and (broken / "shim.log").read_text(), what="shim.log")
    assert "JSONDecodeError" in logged
    assert not (broken / "exit.json").exists()


def test_the_fork_server_loads_no_threading_before_it_forks() -> None:
    """Once `threading` is imported (subprocess imports it), every os.fork runs its at-fork
    handlers: a fork of the server cost 0.8 ms of CPU against 0.35 ms without, twice per job
    (issue 18). The server's state before its first fork (`_preload`), in a fresh shim
    interpreter started as the executor starts it."""
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('shim', {str(Path(_shim.__file__))!r})\n"
        "shim = importlib.util.module_from_spec(spec); spec.loader.exec_module(shim)\n"
        "shim._preload()\n"
        "print(sorted(m for m in ('threading', 'subprocess') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe], env=SHIM_ENV, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a job as another account: needs a root head")
def test_a_job_side_imports_what_it_needs_before_it_drops_to_the_jobs_account() -> None:
    """The fork server imports no threading (above), so a job side that needs it (die with its
    parent: the Ray agent's jobs; a container's pull) imports it itself, before the drop: after
    it, the job's account may not read the interpreter's files (here a Python under /root, 0700),
    and a job that needed them died before its command started."""
    try:
        account = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' account here")
    with passable_dir("gc-fork-") as root:
        logs = root / "jobs"
        logs.mkdir()
        os.chown(logs, account.pw_uid, account.pw_gid)
        executor = LocalExecutor(die_with_parent=True)  # an exec'd shim, as the Ray agent's
        spec = LaunchSpec(
            1, 1, ["sh", "-c", "id -u"], {"PATH": "/usr/bin:/bin"}, "/", root / "run" / "1", logs / "1" / "output.log",
            user="nobody",
        )  # fmt: skip
        handle = executor.launch(spec)
        status = ended(executor, handle)
        assert (status.exit_code, status.error) == (0, None), (status, (root / "run" / "1" / "shim.log").read_bytes())
        assert (logs / "1" / "output.log").read_text() == f"{account.pw_uid}\n"


# ---- the node side of a start, done by the server (issue 18) ------------------------------------


@pytest.fixture
def cgroup_executor() -> Iterator[LocalExecutor]:
    """An executor making job cgroups on this node's real cgroups, under a parent of its own;
    every job cgroup it made, and the parent, removed afterwards."""
    support = cgroups.detect()
    if not support.usable:
        pytest.skip(f"needs writable cgroups: {support.describe()}")
    ex = LocalExecutor(cgroup_support=support, instance=f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield ex
    finally:
        ex.close()
        for left in cgroups.leftovers(support, ex.instance):
            left.kill()
            left.remove()
        cgroups.remove_parent(support, ex.instance)


def test_the_node_side_of_a_start_is_done_by_the_server_not_the_head(
    cgroup_executor: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18: the job dir, run dir, cgroup with its limits, and spec of a start are made by
    the fork server (executors/_node_start.py), none of it in the head's process; the job runs
    in that cgroup, its memory capped as asked; its keeper removes the cgroup when it ends."""
    monkeypatch.setattr(local, "prepare_here", lambda request: pytest.fail("the head did the node's work"))
    spec = replace(
        job(tmp_path, 1, "cat /proc/self/cgroup > where; " + WAIT_FOR_GO, {"GPUCLUSTER_MEMORY_LIMIT": str(64 << 20)}),
        job_dir=tmp_path / "jobs" / "1",
    )
    handle = cgroup_executor.launch(spec)
    try:
        assert (tmp_path / "jobs" / "1").is_dir() and (tmp_path / "run" / "1" / "spec.json").exists()
        paths = handle["cgroup"]
        assert paths == json.loads((tmp_path / "run" / "1" / "spec.json").read_text())["cgroup"]
        where = wait_for(lambda: (tmp_path / "where").exists() and (tmp_path / "where").read_text(), what="the job")
        assert "job-1-attempt-1" in where
        support = cgroup_executor.cgroup_support
        assert support is not None
        if support.memory == cgroups.V2:
            assert (Path(paths[cgroups.V2]) / "memory.max").read_text().strip() == str(64 << 20)
        elif support.memory:
            assert (Path(paths["memory"]) / "memory.limit_in_bytes").read_text().strip() == str(64 << 20)
    finally:
        (tmp_path / "GO").touch()
    assert ended(cgroup_executor, handle).exit_code == 3
    # Removed by the job's keeper before it recorded the exit: the head's cleanup finds it gone.
    assert not any(os.path.exists(path) for path in paths.values())
    cgroup_executor.cleanup(handle)


def test_a_start_the_server_refuses_fails_with_why_and_the_server_serves_on(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    """A start whose node side cannot be made (no such account) fails with the reason, as it did
    when the head made it; nothing runs, and the same server starts the next job."""
    first = executor.launch(job(tmp_path, 1, "exit 0"))
    ended(executor, first)
    assert executor.fork_server is not None
    server = executor.fork_server.pid
    refused = replace(job(tmp_path, 2, "touch RAN"), user="no-such-account-x9", job_dir=tmp_path / "jobs" / "2")
    with pytest.raises(LaunchError, match="there is no Unix account 'no-such-account-x9'"):
        executor.launch(refused)
    assert not (tmp_path / "jobs" / "2").exists() and not (tmp_path / "RAN").exists()
    third = executor.launch(job(tmp_path, 3, "exit 5"))
    assert executor.fork_server.pid == server
    assert ended(executor, third).exit_code == 5


def test_a_start_prepared_again_kills_what_ran_in_its_cgroup_and_makes_it_afresh(
    cgroup_executor: LocalExecutor, tmp_path: Path
) -> None:
    """A server that died before it answered leaves a start half made; the executor asks a new
    one (or does it itself), so a start's node side must be safe to do again: its cgroup is made
    afresh, and whatever ran in the old one is killed, so nothing of it runs on."""
    support = cgroup_executor.cgroup_support
    assert support is not None
    request = {
        "run_dir": str(tmp_path / "run" / "1"),
        "spec": local.shim_spec(argv=["true"], env={}, workdir="/", log=tmp_path / "out.log"),
        "job_dir": str(tmp_path / "jobs" / "1"),
        "user": None,
        "cgroup": {"support": support.to_json(), "instance": cgroup_executor.instance, "leaf": "job-1-attempt-1"},
        "gpu_minors": None,
    }
    paths = local.prepare_here(request)
    assert paths is not None
    inside = subprocess.Popen(
        ["sleep", "1000"], preexec_fn=lambda: cgroups.join(paths), start_new_session=True
    )  # a process of the half-made start
    try:
        assert local.prepare_here(request) == paths
        assert inside.wait(timeout=30) is not None  # killed by the second preparation
        assert cgroups.JobCgroup(paths).pids() == []
    finally:
        if inside.poll() is None:
            inside.kill()
            inside.wait()
    cgroups.JobCgroup(paths).remove()
