"""The node side of an interactive session: the command on a real PTY, served on a unix socket.

Why a server on the node, not a pipe to the head: a session must outlive its viewers. The laptop
sleeps, the CLI is killed, the head restarts; the shell goes on, and whoever may attach later
reconnects to this socket and finds it as it was. The shim's job side runs this after the drop
to the submitter's account (see _shim.py), so the PTY, the command and every connection it makes
for a forwarded port have the submitter's rights and no others.

The socket, RUN_DIR/session.sock, is bound by the job side *before* the drop, in the run dir,
which is the head's alone (0700): only the head (and root) can connect; the submitter reaches it
only through the head, authenticated. Unix socket paths are limited to 107 bytes, so it is bound
and dialled through /proc/self/fd/N of the run dir (`bind_at`, `dial`), whatever the run dir's length.

Protocol: a client sends one JSON line, the *hello*, and reads one JSON line back ({"ok": ...} or
{"error": "..."}). Then, per op:
- attach {"op": "attach", "rows": R, "cols": C}: frames both ways (`frame`, `FrameReader`):
  DATA (keystrokes in, terminal output out), RESIZE ("R C", in), NOTICE (text for the viewer,
  out), EXIT (the command's exit code, out, last). A new attach takes over from the previous one
  (which gets TAKEN and is closed), as `tmux attach -d` does; the last output is replayed.
- forward {"op": "forward", "port": P}: a TCP connection to 127.0.0.1:P made as the submitter,
  then raw bytes both ways.
- status {"op": "status"}: {"ok": true, "quiet_s": seconds since the user last did something,
  "attached": bool}: what idle reclaim asks (telemetry/session_idle.py). Doing something is an
  attach, a keystroke or a resize, or a byte either way through a forwarded port (a notebook open
  in a browser talks to its server); output to a terminal alone is not (`top` left open is idle).
- notice {"op": "notice", "text": T}: T shown to the viewer (and in the transcript, and to the
  next viewer in the replay): the idle warning.

Only the standard library: the shim loads it by path (python -I -S).
"""

import contextlib
import json
import os
import pty
import signal
import socket
import struct
import termios
import threading
import time

SOCKET_NAME = "session.sock"
DATA, RESIZE, NOTICE, EXIT, TAKEN = b"D", b"R", b"N", b"X", b"T"
_HEADER = struct.Struct(">cI")
MAX_FRAME = 1 << 20
MAX_HELLO = 4096
REPLAY_BYTES = 16384  # the newest output, shown to whoever attaches next
CANNOT_START = 127
SEND_TIMEOUT_S = 10.0


# ---- framing, used by both ends (and by the CLI, which speaks it through the head) ---------------


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


class FrameReader:
    """Frames out of a byte stream fed in arbitrary chunks (a socket's reads, WebSocket messages)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes")
            if len(self._buf) < _HEADER.size + size:
                break
            out.append((kind, bytes(self._buf[_HEADER.size : _HEADER.size + size])))
            del self._buf[: _HEADER.size + size]
        return out


def resize_payload(rows: int, cols: int) -> bytes:
    return f"{rows} {cols}".encode()


def _proc_path(dir_fd: int) -> str:
    return f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}"


def bind_at(run_dir: str) -> socket.socket:
    """The listening socket RUN_DIR/session.sock (0600), whatever the length of RUN_DIR's path."""
    dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCKET_NAME, dir_fd=dir_fd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(_proc_path(dir_fd))
        finally:
            os.umask(old)
        sock.listen(16)
        return sock
    finally:
        os.close(dir_fd)


def dial(run_dir: str, hello: dict, timeout: float = 5.0) -> tuple[socket.socket, dict]:  # type: ignore[type-arg]
    """Connect to a session's socket, say hello, return the socket and the server's answer.

    Raises OSError when there is no session server there (yet, or any more), or when it does not
    answer a JSON object within `timeout` in all: the server runs as the job's user, who could
    make it answer slowly or oddly, and the head (telemetry, a relay) must not wait on that."""
    deadline = time.monotonic() + timeout
    dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(_proc_path(dir_fd))
        sock.sendall(json.dumps(hello).encode() + b"\n")
        answer = json.loads(_read_line(sock, deadline) or b"{}")
        if not isinstance(answer, dict):
            raise ValueError("the answer is not a JSON object")
        sock.settimeout(None)
    except (OSError, ValueError) as e:
        sock.close()
        raise OSError(f"session not reachable: {e}") from e
    finally:
        os.close(dir_fd)
    return sock, answer


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    """One line, read a byte at a time so nothing after it is taken from the stream; TimeoutError
    past `deadline` (time.monotonic), however slowly the bytes come."""
    line = bytearray()
    while len(line) < MAX_HELLO:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole line in time")
        sock.settimeout(left)
        b = sock.recv(1)
        if not b:
            break
        if b == b"\n":
            return bytes(line)
        line += b
    return bytes(line)


# ---- the server: runs as the submitter ----------------------------------------------------------


def _set_size(fd: int, rows: int, cols: int) -> None:
    rows, cols = max(1, min(rows, 10000)), max(1, min(cols, 10000))
    termios.tcsetwinsize(fd, (rows, cols))


class _Server:
    def __init__(self, listener: socket.socket, master: int, child: int, log: object) -> None:
        self.listener, self.master, self.child, self.log = listener, master, child, log
        self.lock = threading.Lock()
        self.viewer: socket.socket | None = None
        self.replay = bytearray()
        self.last_traffic = time.monotonic()
        self.exit_code: int | None = None

    def traffic(self) -> None:
        self.last_traffic = time.monotonic()

    # output: the PTY -> transcript, replay buffer, viewer
    def show(self, data: bytes, transcript: bool = True) -> None:
        with self.lock:
            if transcript:
                with contextlib.suppress(OSError):
                    self.log.write(data)  # type: ignore[attr-defined]
            self.replay += data
            del self.replay[:-REPLAY_BYTES]
            viewer = self.viewer
            if viewer is not None:
                self._send(viewer, frame(DATA, data))

    def _send(self, viewer: socket.socket, data: bytes) -> None:
        """Under the lock. A viewer that cannot take output for SEND_TIMEOUT_S is dropped."""
        try:
            viewer.sendall(data)
        except OSError:
            with contextlib.suppress(OSError):
                viewer.close()
            if self.viewer is viewer:
                self.viewer = None

    def pump_output(self) -> None:
        while True:
            try:
                data = os.read(self.master, 1 << 16)
            except InterruptedError:
                continue
            except OSError:  # EIO: every holder of the terminal's other end is gone
                return
            if not data:
                return
            self.show(data)

    def accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve_one, args=(conn,), daemon=True).start()

    def serve_one(self, conn: socket.socket) -> None:
        """One client; attach and forward keep the connection (and close it themselves)."""
        kept = False
        try:
            hello = json.loads(_read_line(conn, time.monotonic() + 10) or b"{}")
            conn.settimeout(None)
            op = hello.get("op")
            if op == "attach":
                kept = True
                self.attach(conn, int(hello.get("rows") or 24), int(hello.get("cols") or 80))
            elif op == "forward":
                kept = True
                self.forward(conn, int(hello.get("port") or 0))
            elif op == "status":
                quiet = time.monotonic() - self.last_traffic
                conn.sendall(_line({"ok": True, "quiet_s": quiet, "attached": self.viewer is not None}))
            elif op == "notice":
                self.show(f"\r\n[gpucluster] {hello.get('text', '')}\r\n".encode())
                conn.sendall(_line({"ok": True}))
            else:
                conn.sendall(_line({"error": f"unknown op {op!r}"}))
        except (OSError, ValueError, TypeError, AttributeError):
            kept = False
        finally:
            if not kept:
                with contextlib.suppress(OSError):
                    conn.close()

    def attach(self, conn: socket.socket, rows: int, cols: int) -> None:
        conn.sendall(_line({"ok": True, "pid": self.child}))
        # A viewer that takes no output for this long is dropped (`_send`), rather than holding
        # the lock and the terminal's output (and a new attach) up for ever.
        conn.settimeout(SEND_TIMEOUT_S)
        with contextlib.suppress(OSError):
            _set_size(self.master, rows, cols)
        with self.lock:
            old, self.viewer = self.viewer, conn
            if old is not None:
                self._send(old, frame(TAKEN, b"attached from elsewhere; detached here"))
                with contextlib.suppress(OSError):
                    old.shutdown(socket.SHUT_RDWR)
            if self.exit_code is None:
                self._send(conn, frame(DATA, bytes(self.replay)))
            else:
                self._send(conn, frame(EXIT, str(self.exit_code).encode()))
        self.traffic()
        reader = FrameReader()
        try:
            while True:
                try:
                    data = conn.recv(1 << 16)
                except TimeoutError:  # nothing typed for a while: fine
                    if self.viewer is not conn:
                        break
                    continue
                if not data:
                    break
                self.traffic()
                for kind, payload in reader.feed(data):
                    if kind == DATA:
                        _write_all(self.master, payload)
                    elif kind == RESIZE:
                        r, c = (int(x) for x in payload.split())
                        _set_size(self.master, r, c)
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                if self.viewer is conn:
                    self.viewer = None
            with contextlib.suppress(OSError):
                conn.close()

    def forward(self, conn: socket.socket, port: int) -> None:
        if not 1 <= port <= 65535:
            conn.sendall(_line({"error": f"port {port} is not a TCP port (1-65535)"}))
            return
        try:
            target = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError as e:
            conn.sendall(_line({"error": f"nothing answers on port {port} of the job's node: {e.strerror or e}"}))
            return
        target.settimeout(None)
        conn.sendall(_line({"ok": True}))
        self.traffic()
        done = threading.Event()

        def copy(src: socket.socket, dst: socket.socket) -> None:
            try:
                while True:
                    data = src.recv(1 << 16)
                    if not data:
                        break
                    self.traffic()
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                if done.is_set():
                    for s in (src, dst):
                        with contextlib.suppress(OSError):
                            s.close()
                done.set()

        threading.Thread(target=copy, args=(target, conn), daemon=True).start()
        copy(conn, target)

    def finish(self, code: int) -> None:
        with self.lock:
            self.exit_code = code
            if self.viewer is not None:
                self._send(self.viewer, frame(EXIT, str(code).encode()))


def _line(record: dict) -> bytes:  # type: ignore[type-arg]
    return json.dumps(record).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def serve(
    listener: socket.socket,
    argv: list[str],
    env: dict[str, str],
    log: object,
    stops: list[int],
    relay_signals: bool = True,
) -> tuple[int, int | None]:
    """Run argv on a new PTY (its own session, the PTY its controlling terminal) and serve it
    until it exits; return its exit code (shell convention: 128 + N when killed by signal N) and
    the signal that killed it, if one did.

    `stops` are the signals the job side received before the command existed (a cancel, a
    preemption): passed on to it. Later ones are passed on too when `relay_signals` (no cgroup:
    the keeper's signal reaches only the job side's process group); in a cgroup the keeper has
    signalled every process of the job already, and a second signal a moment after the first
    would kill what the first one's handler starts (see _shim.py's `send`)."""
    try:
        child, master = pty.fork()
    except OSError as e:
        log.write(f"gpucluster: cannot open a terminal for the session: {e.strerror}\n".encode())  # type: ignore[attr-defined]
        return CANNOT_START, None
    if child == 0:  # the session's command: a new session led by it, the PTY its terminal
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            os.write(2, f"gpucluster: cannot start {argv[0]!r}: {e.strerror}\r\n".encode())
        os._exit(CANNOT_START)
    server = _Server(listener, master, child, log)

    def pass_on(signum: int, _frame: object, relay: bool = relay_signals) -> None:
        """To the session's leader's group and to the terminal's foreground group (a shell's
        running command has a group of its own: job control), as a terminal's hang-up reaches both."""
        if signum == signal.SIGTERM:  # a cancel, a time limit, a preemption or idle reclaim: say so
            text = b"\r\n[gpucluster] the session is being stopped (SIGTERM); it is killed after the grace period\r\n"
            threading.Thread(target=server.show, args=(text,), daemon=True).start()
        if not relay:
            return
        groups = {child}
        with contextlib.suppress(OSError):
            groups.add(os.tcgetpgrp(master))
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)

    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(stop, pass_on)
    for early in stops:  # arrived before the command existed, which no signal reached then
        pass_on(early, None, relay=True)
    threading.Thread(target=server.accept_loop, daemon=True).start()
    pump = threading.Thread(target=server.pump_output, daemon=True)
    pump.start()
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = 128 + sig if sig is not None else os.waitstatus_to_exitcode(status)
    pump.join(timeout=2)  # the last output, before the exit frame
    server.finish(code)
    # What the command left in its session (background jobs of the shell) goes with it; where
    # the job has a cgroup the keeper kills every leftover anyway.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child, signal.SIGKILL)
    time.sleep(0.2)  # let a viewer's relay take the exit frame before the socket goes
    with contextlib.suppress(OSError):
        listener.close()
    with contextlib.suppress(OSError):
        os.close(master)
    return code, sig
