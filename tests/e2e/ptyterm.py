"""A program on a real pseudo-terminal, driven like a person at a keyboard (stdlib pty; what
pexpect does, in the few lines these tests need).

The program is its PTY's session leader, so a test's Ctrl-C reaches it as a terminal's does, and
resizing the PTY sends it SIGWINCH. `close` kills its process group by id, even after a failure.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import termios
import time

from .headproc import SLACK


class Term:
    def __init__(self, argv: list[str], env: dict[str, str], rows: int = 24, cols: int = 80) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the program, on the PTY's slave end as its controlling terminal
            try:
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        termios.tcsetwinsize(fd, (rows, cols))
        self.output = b""  # everything read so far
        self.seen = 0  # where the next expect starts looking
        self.status: int | None = None

    def read_some(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the program and all its children closed the terminal
            data = b""
        if not data:
            raise EOFError
        self.output += data
        return True

    def expect(self, pattern: bytes | str, timeout: float = 20.0) -> re.Match[bytes]:
        """Wait for `pattern` (a regex) in the output after the previous match."""
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout * SLACK
        while True:
            m = regex.search(self.output, self.seen)
            if m is not None:
                self.seen = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                self.read_some(min(left, 0.5))
            except EOFError:
                m = regex.search(self.output, self.seen)
                if m is not None:
                    self.seen = m.end()
                    return m
                break
        raise AssertionError(f"{pattern!r} not seen; output after the last match: {self.output[self.seen :]!r}")

    def send(self, data: bytes | str) -> None:
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def resize(self, rows: int, cols: int) -> None:
        """As a terminal window resized: the kernel sends the program SIGWINCH."""
        termios.tcsetwinsize(self.fd, (rows, cols))

    def wait(self, timeout: float = 30.0) -> int:
        """The program's exit code (reading its output meanwhile, so it never blocks on a full PTY)."""
        deadline = time.monotonic() + timeout * SLACK
        while self.status is None and time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                break
            with contextlib.suppress(EOFError):
                self.read_some(0.1)
        if self.status is None:
            raise AssertionError(f"the program did not exit; its output: {self.output[-2000:]!r}")
        with contextlib.suppress(EOFError, OSError):
            while self.read_some(0.05):
                pass
        return self.status

    def close(self) -> None:
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.status = -9
        with contextlib.suppress(OSError):
            os.close(self.fd)
