"""The client end of a session's terminal and of a port tunnel, over the head's WebSockets.

The terminal: the local terminal goes raw (every key, Ctrl-C and Ctrl-D included, reaches the
remote PTY, whose own line discipline turns them into SIGINT and end-of-file there); window size
changes are sent as they happen (SIGWINCH); output is written as it comes. The frames are the
session server's (executors/_session.py): the head relays them without reading them.

Detach: Ctrl-] then d (Ctrl-] twice sends one Ctrl-]), as a prefix key in tmux: the session
goes on, `gpucluster attach JOB` returns to it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
from typing import Any

from gpucluster.errors import GpuclusterError
from gpucluster.executors._session import DATA, EXIT, NOTICE, RESIZE, TAKEN, FrameReader, frame, resize_payload

DETACH_PREFIX = b"\x1d"  # Ctrl-]
DETACH_KEY = b"d"
DETACHED = -1  # attach() result: the user detached
LOST = -2  # attach() result: the connection went without an exit code
TAKEN_OVER = -3  # attach() result: the session was attached from elsewhere


class Refused(GpuclusterError):
    """The head refused the WebSocket (its HTTP status and message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def open_ws(uri: str, headers: dict[str, str], ssl_context: Any = None) -> Any:
    """A connected sync WebSocket; Refused with the head's own message when it says no."""
    from websockets.exceptions import InvalidHandshake, InvalidStatus
    from websockets.sync.client import connect

    try:
        return connect(
            uri,
            additional_headers=headers,
            ssl=ssl_context,
            open_timeout=30,
            max_size=4 << 20,
            compression=None,
            ping_interval=20,
            ping_timeout=60,
        )
    except InvalidStatus as e:
        import json

        body = e.response.body or b""
        try:
            message = str(json.loads(body).get("error") or body.decode(errors="replace"))
        except (ValueError, AttributeError):
            message = body.decode(errors="replace") or f"HTTP {e.response.status_code}"
        raise Refused(e.response.status_code, message) from None
    except (InvalidHandshake, OSError, TimeoutError) as e:
        raise Refused(0, f"cannot open the connection: {e}") from None


def terminal_size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdin.fileno())
    except OSError:
        return 24, 80
    return size.lines, size.columns


class _Detach:
    """The Ctrl-] d key sequence, recognised across reads."""

    def __init__(self) -> None:
        self.pending = False

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """What to send, and whether the user asked to detach."""
        out = bytearray()
        for b in data:
            ch = bytes([b])
            if self.pending:
                self.pending = False
                if ch == DETACH_KEY:
                    return bytes(out), True
                out += DETACH_PREFIX if ch == DETACH_PREFIX else DETACH_PREFIX + ch
            elif ch == DETACH_PREFIX:
                self.pending = True
            else:
                out += ch
        return bytes(out), False


def attach(ws: Any, stdin: int = 0, stdout: int = 1) -> int:
    """Relay the local terminal to the session until it exits (its exit code), the user
    detaches (DETACHED) or the connection goes (LOST)."""
    import termios
    import tty

    result: list[int] = []
    wake_r, wake_w = os.pipe()
    is_tty = os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if is_tty else None

    def receive() -> None:
        reader = FrameReader()
        try:
            for message in ws:
                data = message if isinstance(message, bytes) else message.encode()
                for kind, payload in reader.feed(data):
                    if kind == DATA:
                        _write_all(stdout, payload)
                    elif kind == NOTICE:
                        _write_all(stdout, b"\r\n[gpucluster] " + payload + b"\r\n")
                    elif kind == EXIT:
                        result.append(int(payload or b"0"))
                        return
                    elif kind == TAKEN:
                        _write_all(stdout, b"\r\n[gpucluster] " + payload + b"\r\n")
                        result.append(TAKEN_OVER)
                        return
        except Exception:  # the connection went: LOST, below
            pass
        finally:
            os.write(wake_w, b"x")

    # SIGWINCH only wakes the loop below, which sends the new size: a send from the handler could
    # interrupt a send of keys in this same thread, inside the WebSocket's lock.
    winch_r, winch_w = os.pipe()
    os.set_blocking(winch_w, False)
    os.set_blocking(winch_r, False)

    def resized(*_: object) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(winch_w, b"w")

    old_winch = signal.signal(signal.SIGWINCH, resized) if is_tty else None
    if saved is not None:
        tty.setraw(stdin, termios.TCSANOW)  # not TCSAFLUSH: what was typed while attaching is kept
    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    detach = _Detach()
    reading = True
    try:
        while True:
            try:
                ready, _, _ = select.select([stdin, wake_r, winch_r] if reading else [wake_r, winch_r], [], [])
            except InterruptedError:
                continue
            if wake_r in ready:
                break
            # A resize goes before keys typed after it. Not `winch_r in ready`: the kernel may
            # give SIGWINCH to the receiver thread, which does not interrupt this select; its
            # handler then runs here, after select returned for the keys alone.
            if _drained(winch_r):
                try:
                    ws.send(frame(RESIZE, resize_payload(*terminal_size())))
                except Exception:
                    break
            if stdin not in ready:
                continue
            data = os.read(stdin, 4096)
            if not data:
                reading = False  # stdin ended (not a terminal): the session decides when to end
                continue
            send, detached = detach.feed(data)
            if send:
                try:
                    ws.send(frame(DATA, send))
                except Exception:
                    break
            if detached:
                result.append(DETACHED)
                break
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if old_winch is not None:
            signal.signal(signal.SIGWINCH, old_winch)
        with contextlib.suppress(Exception):
            ws.close()
        receiver.join(timeout=5)
        for fd in (wake_r, wake_w, winch_r, winch_w):
            os.close(fd)
    return result[0] if result else LOST


def _drained(fd: int) -> bool:
    """Whether the non-blocking pipe `fd` had bytes (read them all)."""
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def _write_all(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def serve_forward(listener: socket.socket, open_tunnel: Any, on_error: Any) -> None:
    """Each connection to `listener` through a tunnel of its own (`open_tunnel()`: a WebSocket),
    until interrupted."""
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_tunnel, args=(conn, open_tunnel, on_error), daemon=True).start()


def _tunnel(conn: socket.socket, open_tunnel: Any, on_error: Any) -> None:
    try:
        ws = open_tunnel()
    except Refused as e:
        on_error(str(e))
        conn.close()
        return

    def down() -> None:  # the job's port -> the local connection
        try:
            for message in ws:
                conn.sendall(message if isinstance(message, bytes) else message.encode())
        except Exception:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=down, daemon=True)
    t.start()
    try:
        while data := conn.recv(1 << 16):
            ws.send(data)
    except Exception:
        pass
    finally:
        # Half-close is not a WebSocket notion: the answer may still come, so wait for it
        # (an HTTP client sends its request and then waits with its sending side open anyway).
        t.join(timeout=300)
        with contextlib.suppress(Exception):
            ws.close()
        conn.close()
