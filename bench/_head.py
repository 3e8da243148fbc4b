"""Start and stop a throwaway gpucluster head (`gpucluster up --virtual-gpus N`) for a benchmark.

Why this is more than Popen + kill: gpucluster jobs outlive their head by design (each runs
under a shim in its own session, to be re-adopted by the next head), so a benchmark that only
stopped the head would leave its `sleep 1000` jobs behind. stop() therefore cancels running jobs
through the API first, and then, as a last resort, kills any job process group still alive that
the data dir's shim.json files name (by pgid, and only if pid and start time still match).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from gpucluster import userconfig
from gpucluster.launch.ranks import pick_free_port

GPUCLUSTER = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpucluster"
_PROBLEM = re.compile(r"Traceback|Exception|\bERROR\b|\bCRITICAL\b|failed", re.IGNORECASE)


class HeadError(RuntimeError):
    """The head did not start or misbehaved; the message quotes its output."""


def free_port() -> int:
    """A loopback port held for the head started next (`pick_free_port` says why)."""
    return pick_free_port("127.0.0.1")


@dataclass
class Head:
    """A head process this benchmark started, with its own port, data dir and log file."""

    proc: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log_path: Path
    jobs_left_running: int = 0  # job process groups alive after the head stopped (expected)
    unkillable: list[int] = field(default_factory=list)  # pgids that survived SIGKILL (a problem)
    token: str = ""  # the head's first cluster admin token (not rate limited)

    @property
    def headers(self) -> dict[str, str]:
        """For httpx clients: every API call but /v1/health needs the token."""
        return {"Authorization": f"Bearer {self.token}"}

    def log_problems(self, limit: int = 20) -> list[str]:
        """Lines of the head's output that look like errors, for the report."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [ln for ln in lines if _PROBLEM.search(ln)][:limit]

    def stop(self) -> None:
        """SIGTERM (then SIGKILL) the head, then end the jobs it left running.

        Cancelling through the API first would not do: the head starts the next queued job on
        each freed GPU, and cancelling thousands of queued jobs one by one takes minutes.
        """
        _terminate(self.proc, timeout=10)
        time.sleep(0.5)  # a shim launched just before the head stopped writes shim.json now
        self.jobs_left_running, self.unkillable = _kill_job_groups(self.data_dir)


def start(
    gpus: int,
    data_dir: Path,
    log_path: Path,
    timeout: float = 60,
    extra: tuple[str, ...] = (),
    src: Path | None = None,
) -> Head:
    """Start `gpucluster up` in its own session and wait until GET /v1/health answers 200.

    The head writes its admin token to a config file next to the data dir (GPUCLUSTER_CONFIG),
    never to the user's own ~/.config. `src`: another checkout's `src` to run the head from
    (PYTHONPATH), so a benchmark can measure a baseline tree side by side with this one."""
    # The installed script, else this interpreter with the sources on its path (a worktree).
    use_script = GPUCLUSTER.exists() and src is None
    command = [str(GPUCLUSTER)] if use_script else [sys.executable, "-m", "gpucluster.cli.main"]
    port = free_port()
    argv = [
        *command, "up", *extra, "--virtual-gpus", str(gpus), "--gpu-type", "H100-80GB",
        "--port", str(port), "--data-dir", str(data_dir), "--grace-period", "2s",
    ]  # fmt: skip
    config = data_dir.parent / "gpucluster-config.yaml"
    env = {**os.environ, userconfig.ENV_PATH: str(config)}
    if src is not None:
        env["PYTHONPATH"] = str(src.resolve())
    log: IO[bytes]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    head = Head(proc, f"http://127.0.0.1:{port}", data_dir, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HeadError(f"gpucluster up exited with {proc.returncode}:\n{tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{head.url}/v1/health", timeout=2).status_code == 200:
                head.token = userconfig.load(config).token_for(head.url) or ""
                return head
        time.sleep(0.1)
    head.stop()
    raise HeadError(f"head not healthy after {timeout:.0f}s:\n{tail(log_path)}")


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no output)"


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the head (it shuts down cleanly on it), SIGKILL it if it does not exit in time."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _start_ticks(pid: int) -> int | None:
    """Kernel start time of a live process (None if gone or a zombie): pid identity over time."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _kill_job_groups(data_dir: Path, grace: float = 5) -> tuple[int, list[int]]:
    """End the job process groups still alive (SIGTERM, then SIGKILL after `grace`).

    Returns how many there were and the pgids that survived even SIGKILL.
    """
    alive: list[tuple[int, tuple[int, ...], int]] = []
    # The head's own records (head/paths.py): run/<job>/attempt-N/shim.json, and one per rank.
    shims = [*data_dir.glob("run/*/attempt-*/shim.json"), *data_dir.glob("run/*/attempt-*/rank-*/shim.json")]
    for shim in shims:
        try:
            info = json.loads(shim.read_text())
            pid, ticks = int(info["pid"]), int(info["start_ticks"])
            # The keeper's group, and the command's own (the job side leads a session of its own).
            pgids = (int(info["pgid"]), *([int(info["job_pgid"])] if info.get("job_pgid") else []))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _start_ticks(pid) == ticks:  # the shim is still that process, not a recycled pid
            alive.append((pid, pgids, ticks))
    found = len(alive)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for _, pgids, _ in alive:
            for pgid in pgids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [a for a in alive if _start_ticks(a[0]) == a[2]]
    return found, [pgids[0] for _, pgids, _ in alive]
