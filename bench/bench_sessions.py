"""Interactive sessions (issue 21): how soon a prompt, and how fast a keystroke comes back.

Two figures, each beside its baseline in the same run, rounds interleaved so a load change hits
both:

- submit -> interactive prompt: from starting `gpucluster run --gpus 1 -- bash` on a PTY (a free
  GPU waiting) to bash's prompt on that terminal: the CLI's start, the submit, the scheduler's
  start of the job, the shim and its PTY, the WebSocket through the head. Baseline: `bash` started
  on a local PTY, to its prompt (what `srun --pty bash` cannot beat either).
- keystroke echo round trip: one key typed into the session's bash and its echo read back, through
  the CLI, the head's WebSocket relay and the session's socket, p50 and p99. Baseline: the same
  key into a local bash on a local PTY.

The head is a real `gpucluster up --virtual-gpus 8` started here (bench/_head.py); every session
ends with `exit`, and the head's stop kills whatever is left.

Run: `PYTHONPATH=src python bench/bench_sessions.py [--sessions 20] [--keys 400]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import pty
import select
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import httpx

import _head
from gpucluster import userconfig

PROMPT = b"P> "
BASH = ["bash", "--norc", "--noprofile"]


class Pty:
    """A program on a new PTY, read until a pattern shows."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.buf = b""

    def until(self, needle: bytes, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"{needle!r} not seen; output: {self.buf[-500:]!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    raise SystemExit(f"the program ended before {needle!r}; output: {self.buf[-500:]!r}")
                self.buf += data
        self.buf = self.buf[self.buf.index(needle) + len(needle) :]

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def finish(self) -> int:
        self.send(b"\x15exit\r")  # Ctrl-U first: whatever is on the line goes
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                if select.select([self.fd], [], [], 0.1)[0]:
                    os.read(self.fd, 65536)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        return -9


def to_prompt(argv: list[str], env: dict[str, str]) -> tuple[float, Pty]:
    t0 = time.perf_counter()
    p = Pty(argv, env)
    p.until(PROMPT)
    return time.perf_counter() - t0, p


def echo_times(p: Pty, keys: int) -> list[float]:
    """Round trips of single keystrokes; the line is cleared (Ctrl-U) every 50 keys, untimed."""
    out = []
    for i in range(keys):
        if i and i % 50 == 0:
            p.send(b"\x15echo cleared\r")
            p.until(b"cleared\r\n")
            p.until(PROMPT)
        t0 = time.perf_counter()
        p.send(b"a")
        p.until(b"a")
        out.append(time.perf_counter() - t0)
    return out


def cancel_running(head: _head.Head, timeout: float = 60.0) -> None:
    """Sessions outlive their head by design: any still running (a failed round) is cancelled
    through the API, and waited for, before the head stops."""
    url, headers = head.url, head.headers
    jobs = httpx.get(f"{url}/v1/jobs", params={"state": "running"}, headers=headers, timeout=30).json()["jobs"]
    for job in jobs:
        httpx.post(f"{url}/v1/jobs/{job['id']}/cancel", headers=headers, timeout=30)
    deadline = time.monotonic() + timeout
    while jobs and time.monotonic() < deadline:
        time.sleep(0.2)
        jobs = httpx.get(f"{url}/v1/jobs", params={"state": "running"}, headers=headers, timeout=30).json()["jobs"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--keys", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        head = _head.start(8, base / "data", base / "head.log")
        try:
            env = {
                **os.environ,
                "GPUCLUSTER_URL": head.url,
                userconfig.ENV_PATH: str(base / "gpucluster-config.yaml"),
                "TERM": "xterm",
                "PS1": PROMPT.decode(),
            }
            cli = [sys.executable, "-m", "gpucluster.cli.main"]
            session = [*cli, "run", "--gpus", "1", "--env", f"PS1={PROMPT.decode()}", "--", *BASH]
            starts: dict[str, list[float]] = {"session": [], "local": []}
            for _ in range(args.sessions):
                for name, argv in (("session", session), ("local", BASH)):
                    seconds, p = to_prompt(argv, env)
                    starts[name].append(seconds)
                    code = p.finish()
                    if code != 0:
                        raise SystemExit(f"{name} exited {code}")
            echoes: dict[str, list[float]] = {}
            for name, argv in (("session", session), ("local", BASH)):
                _, p = to_prompt(argv, env)
                echo_times(p, 20)  # warm-up
                echoes[name] = echo_times(p, args.keys)
                p.finish()
        finally:
            cancel_running(head)
            head.stop()
    s50, l50 = statistics.median(starts["session"]), statistics.median(starts["local"])
    e50, e99 = pct(echoes["session"], 50), pct(echoes["session"], 99)
    b50, b99 = pct(echoes["local"], 50), pct(echoes["local"], 99)
    print(f"machine: {platform.node()} {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    print(f"submit -> prompt, p50 of {args.sessions}: session {s50 * 1000:.0f} ms; local bash {l50 * 1000:.0f} ms "
          f"(ratio {s50 / l50:.1f}x); session min {min(starts['session']) * 1000:.0f} max "
          f"{max(starts['session']) * 1000:.0f} ms")  # fmt: skip
    print(f"keystroke echo, {args.keys} keys: session p50 {e50 * 1000:.2f} ms p99 {e99 * 1000:.2f} ms; "
          f"local p50 {b50 * 1000:.3f} ms p99 {b99 * 1000:.3f} ms (p50 ratio {e50 / b50:.0f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
