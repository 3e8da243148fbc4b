"""How the job side starts a command and pumps its output (executors/_shim.py `_spawn_command`
and `_pump_until_exit`: posix_spawn and no pump thread since issue 18): as subprocess.Popen and
the thread did, so no job sees a difference. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from gpucluster.executors import _shim


def _program(path: Path, body: str, executable: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755 if executable else 0o644)


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """The command's exit code and everything it wrote to stdout and stderr."""
    read_fd, out = os.pipe()
    try:
        pid = _shim._spawn_command(argv, env, out)
    finally:
        os.close(out)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


def test_a_bare_name_is_found_on_the_jobs_path_not_the_shims(tmp_path: Path) -> None:
    _program(tmp_path / "bin" / "only-the-job-has-it", "echo found; echo err >&2")
    assert str(tmp_path) not in os.environ.get("PATH", "")
    code, output = _run(["only-the-job-has-it"], {"PATH": f"/usr/bin:/bin:{tmp_path / 'bin'}"})
    assert (code, output) == (0, b"found\nerr\n")


def test_a_program_that_cannot_run_is_passed_over_for_the_next_on_path(tmp_path: Path) -> None:
    _program(tmp_path / "a" / "prog", "echo a", executable=False)
    _program(tmp_path / "b" / "prog", "echo b")
    code, output = _run(["prog"], {"PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}"})
    assert (code, output) == (0, b"b\n")


def test_the_first_error_other_than_missing_is_the_one_reported(tmp_path: Path) -> None:
    _program(tmp_path / "b" / "prog", "echo b", executable=False)
    with pytest.raises(PermissionError):
        _shim._spawn_command(["prog"], {"PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}"}, 1)
    with pytest.raises(FileNotFoundError):
        _shim._spawn_command(["no-such-program-anywhere"], {"PATH": str(tmp_path / "a")}, 1)
    with pytest.raises(FileNotFoundError):
        _shim._spawn_command([str(tmp_path / "no" / "such")], {"PATH": "/usr/bin:/bin"}, 1)


def test_the_command_gets_dev_null_as_stdin_default_signals_and_only_its_environment(tmp_path: Path) -> None:
    """Python ignores SIGPIPE (and SIGXFSZ): an ignored signal stays ignored across an exec, so
    `yes | head` would never end if the command inherited that. Popen put them back; so must this."""
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # as in the shim
    script = "readlink /proc/self/fd/0; grep SigIgn /proc/self/status; env"
    code, output = _run(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin", "ONLY": "this"})
    assert code == 0
    stdin, ignored, *env = output.decode().splitlines()
    assert stdin == os.devnull
    mask = int(ignored.split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1)) and not mask & (1 << (signal.SIGXFSZ - 1))
    assert "ONLY=this" in env and not any(line.startswith("HOME=") for line in env)


def test_no_fd_of_the_job_side_reaches_the_command(tmp_path: Path) -> None:
    """As Popen's close_fds: not even one that is not close-on-exec (a leak of some library's)."""
    kept = os.open(tmp_path / "secret", os.O_WRONLY | os.O_CREAT, 0o600)
    os.set_inheritable(kept, True)
    try:
        code, output = _run(["/bin/ls", "/proc/self/fd"], {"PATH": "/usr/bin:/bin"})
    finally:
        os.close(kept)
    assert code == 0
    assert sorted(int(fd) for fd in output.split()) == [0, 1, 2, 3]  # 3: ls's own listing of the directory
    assert stat.S_ISREG(os.stat(tmp_path / "secret").st_mode)


def test_a_background_child_that_keeps_writing_does_not_hold_the_exit_record_up(tmp_path: Path) -> None:
    """The pump (now in the job side's one thread) stops DRAIN_S after the command's end even
    while a child it left behind still writes to the pipe; the keeper then kills that child."""
    from gpucluster.executors.local import SHIM_ENV, shim_argv, write_shim_spec

    script = "(while :; do echo more; sleep 0.01; done) & echo started"
    log = tmp_path / "out.log"
    write_shim_spec(tmp_path, argv=["/bin/sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, workdir="/", log=log)
    done = subprocess.run(shim_argv(tmp_path), env=SHIM_ENV, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 0
    shim = json.loads((tmp_path / "shim.json").read_text())
    out = log.read_bytes()  # the background loop may write before or after `started`: either order
    assert out.count(b"started\n") == 1 and b"more\n" in out, out[:200]
    assert _live_members(shim["job_pgid"]) == []  # the whole group was killed before the record


def _live_members(pgid: int) -> list[int]:
    """Processes of the group that are not dead (a killed orphan may wait a moment as a zombie)."""
    live = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            live.append(int(entry))
    return live


def test_path_entries_without_the_name_are_passed_over_without_a_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the PATH entries that hold the name are tried (one spawn, not one per directory),
    and a name on none of them is still "not found"."""
    _program(tmp_path / "here" / "tool", "echo found")
    path = os.pathsep.join(str(tmp_path / d) for d in ("a", "b", "c", "here"))
    tried: list[str] = []
    real = os.posix_spawn

    def counted(file: str, *args: object, **kwargs: object) -> int:
        tried.append(file)
        return real(file, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "posix_spawn", counted)
    assert _run(["tool"], {"PATH": path}) == (0, b"found\n")
    assert tried == [str(tmp_path / "here" / "tool")]
    with pytest.raises(FileNotFoundError):
        _run(["absent"], {"PATH": path})
