"""The node side of a session (executors/_session.py) through the real local executor and shim,
without a head: the protocol, the activity clock idle reclaim reads, notices, takeover, and a
run dir whose path is longer than a unix socket's path may be."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.cli.terminal import _Detach
from gpucluster.executors import _session as S
from gpucluster.executors.base import Exited, LaunchSpec, Running
from gpucluster.executors.local import LocalExecutor

from ..e2e.headproc import wait_for


class Viewer:
    """One attached connection, read frame by frame."""

    def __init__(self, run_dir: Path, rows: int = 24, cols: int = 80) -> None:
        self.sock, answer = S.dial(str(run_dir), {"op": "attach", "rows": rows, "cols": cols})
        assert answer["ok"] is True
        self.sock.settimeout(30)
        self.reader = S.FrameReader()
        self.frames: list[tuple[bytes, bytes]] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(S.frame(S.DATA, data))

    def until(self, kind: bytes, *needles: bytes) -> bytes:
        """The frames of `kind` received until every needle is in them, in any order (with none:
        one frame). Frames after the one that completed it, and frames of other kinds, stay for
        the next call: one recv can carry several, and dropping them lost output a later call
        waited for (the session server's stop notice comes from a thread of its own, so under
        load the command's reaction to the stop could arrive first, in the same read)."""
        got = b""
        while True:
            while (i := next((n for n, (k, _) in enumerate(self.frames) if k == kind), None)) is not None:
                got += self.frames.pop(i)[1]
                if all(n in got for n in needles):
                    return got
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError(f"closed before {kind!r} {needles!r}; got {got!r}")
            self.frames += self.reader.feed(data)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[tuple[LocalExecutor, dict[str, object], Path]]:
    # Deeper than a unix socket's 107 bytes: the socket is bound and dialled through /proc/self/fd.
    run_dir = tmp_path / ("d" * 60) / ("e" * 60) / "run"
    ex = LocalExecutor()
    env = {"PATH": os.environ["PATH"], "TERM": "xterm", "PS1": "P> ", "GPUCLUSTER_ATTEMPT_DIR": str(run_dir)}
    spec = LaunchSpec(
        job_id=1, attempt=1, argv=["bash", "--norc", "--noprofile"], env=env, workdir="/tmp",
        run_dir=run_dir, log_path=tmp_path / "log", session=True, marker=f"GPUCLUSTER_ATTEMPT_DIR={run_dir}",
    )  # fmt: skip
    handle = ex.launch(spec)
    wait_for(lambda: (run_dir / S.SOCKET_NAME).exists(), timeout=20, what="the session's socket")
    assert len(str(run_dir / S.SOCKET_NAME)) > 108
    yield ex, handle, tmp_path
    ex.signal(handle, 9)
    wait_for(lambda: not isinstance(ex.poll(handle), Running), timeout=20, what="the session to end")
    ex.cleanup(handle)


def status(run_dir: Path) -> dict[str, object]:
    sock, answer = S.dial(str(run_dir), {"op": "status"})
    sock.close()
    return answer


def test_typing_output_resize_notice_activity_takeover_and_exit(session: tuple) -> None:  # type: ignore[type-arg]
    ex, handle, tmp = session
    run_dir = Path(handle["run_dir"])
    v = Viewer(run_dir, rows=33, cols=111)
    v.until(S.DATA, b"P> ")
    v.send(b"stty size; echo sum=$((40+2))\r")
    assert b"33 111" in v.until(S.DATA, b"sum=42")

    v.sock.sendall(S.frame(S.RESIZE, S.resize_payload(50, 160)))
    v.send(b"stty size\r")
    v.until(S.DATA, b"50 160")

    # The activity clock: output alone does not reset it, input does.
    quiet = wait_for(lambda: (q := float(status(run_dir)["quiet_s"])) >= 0.3 and q, timeout=10, what="quiet")
    v.send(b"x\x15")  # a key (and Ctrl-U, clearing it)
    wait_for(lambda: float(status(run_dir)["quiet_s"]) < quiet, timeout=10, what="activity noted")

    sock, answer = S.dial(str(run_dir), {"op": "notice", "text": "idle soon"})
    sock.close()
    assert answer == {"ok": True}
    v.until(S.DATA, b"[gpucluster] idle soon")

    second = Viewer(run_dir)  # takes over; the replay shows what was on screen
    assert b"[gpucluster] idle soon" in second.until(S.DATA, b"idle soon")
    assert v.until(S.TAKEN) == b"attached from elsewhere; detached here"

    second.send(b"exit 9\r")
    assert second.until(S.EXIT) == b"9"
    ended = wait_for(lambda: isinstance(ex.poll(handle), Exited), timeout=20, what="the session's exit record")
    assert ended and ex.poll(handle).exit_code == 9
    transcript = (tmp / "log").read_bytes()
    assert b"sum=42" in transcript and b"[gpucluster] idle soon" in transcript


def test_a_forward_connects_as_the_session_to_a_local_port(session: tuple) -> None:  # type: ignore[type-arg]
    _, handle, _ = session
    run_dir = Path(handle["run_dir"])
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sock, answer = S.dial(str(run_dir), {"op": "forward", "port": port})
        assert answer == {"ok": True}
        conn, _ = server.accept()
        with conn, sock:
            sock.sendall(b"ping")
            assert conn.recv(4) == b"ping"
            conn.sendall(b"pong")
            assert sock.recv(4) == b"pong"
    sock, answer = S.dial(str(run_dir), {"op": "forward", "port": port})  # nothing listens now
    sock.close()
    assert "nothing answers on port" in answer["error"]
    sock, answer = S.dial(str(run_dir), {"op": "forward", "port": 70000})
    sock.close()
    assert "is not a TCP port" in answer["error"]


def test_frames_survive_any_split_and_the_detach_keys() -> None:
    stream = S.frame(S.DATA, b"hello") + S.frame(S.EXIT, b"3")
    for cut in range(len(stream) + 1):
        r = S.FrameReader()
        assert r.feed(stream[:cut]) + r.feed(stream[cut:]) == [(S.DATA, b"hello"), (S.EXIT, b"3")]
    with pytest.raises(ValueError):
        S.FrameReader().feed(b"D" + (S.MAX_FRAME + 1).to_bytes(4, "big"))
    d = _Detach()
    assert d.feed(b"ab\x1d") == (b"ab", False)  # the prefix waits for the next key
    assert d.feed(b"d") == (b"", True)
    d = _Detach()
    assert d.feed(b"\x1d\x1dx\x1dq") == (b"\x1dx\x1dq", False)  # Ctrl-] twice: one; another key: both


def test_a_stop_reaches_the_foreground_command_and_is_announced(session: tuple) -> None:  # type: ignore[type-arg]
    ex, handle, _ = session  # no cgroup here: the session passes the keeper's SIGTERM on itself
    run_dir = Path(handle["run_dir"])
    v = Viewer(run_dir)
    v.until(S.DATA, b"P> ")
    # the shell puts `sleep` in a process group of its own
    v.send(b"sleep " + _SLEEP + b"; echo after=$?\r")
    v.until(S.DATA, b"\r\n")
    # In the terminal's foreground, not only started: the server passes a stop to the terminal's
    # foreground group, and a SIGTERM sent before the shell handed the terminal to the sleep's
    # group reached only the shell, which ignores it (a fresh-clone CI run timed out so, once).
    wait_for(lambda: _sleeping(foreground=True), timeout=20, what="the sleep, in the foreground")
    ex.signal(handle, signal.SIGTERM)
    # The notice and the foreground command's end, in either order (the server shows the notice
    # from a thread; a fresh-clone CI run and a loop under load had the sleep's end first): the
    # foreground command got the stop; the interactive shell ignores it.
    v.until(S.DATA, b"[gpucluster] the session is being stopped (SIGTERM)", b"after=143")
    assert not _sleeping()


# This test run's own sleep: another run of this test on the machine (a second checkout) must
# not be taken for it, nor keep it "sleeping" after this one's ended.
_SLEEP = str(40000 + os.getpid() % 20000).encode()


def _sleeping(foreground: bool = False) -> bool:
    """This run's sleep exists (and, with `foreground`, its group holds its terminal: /proc's
    stat fields pgrp and tpgid are equal)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if f.read() != b"sleep\x00" + _SLEEP + b"\x00":
                        continue
                if not foreground:
                    return True
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()  # after the command's name
                return fields[2] == fields[5]  # pgrp, tpgid
            except (OSError, IndexError):
                continue
    return False


def test_the_head_never_waits_long_on_a_server_its_user_controls(tmp_path: Path) -> None:
    """The session server runs as the job's user, who could make it dribble or answer nonsense."""
    import threading

    listener = S.bind_at(str(tmp_path))
    stop = threading.Event()

    def dribble() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                if stop.is_set():
                    return
                for _ in range(20):  # one byte every 0.2 s, never a newline
                    if stop.wait(0.2):
                        return
                    conn.sendall(b"x")

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    try:
        began = time.monotonic()
        with pytest.raises(OSError, match="session not reachable"):
            S.dial(str(tmp_path), {"op": "status"}, timeout=1.0)
        assert time.monotonic() - began < 3.0  # the whole answer's deadline, not one per byte
    finally:
        stop.set()
        listener.close()
        t.join(5)
    listener = S.bind_at(str(tmp_path))  # an answer that is JSON but no object
    try:
        threading.Thread(target=lambda: _answer_once(listener, b"[1, 2]\n"), daemon=True).start()
        with pytest.raises(OSError, match="not a JSON object"):
            S.dial(str(tmp_path), {"op": "status"}, timeout=5.0)
    finally:
        listener.close()


def _answer_once(listener: socket.socket, answer: bytes) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.recv(4096)
        conn.sendall(answer)
