"""Job shim: the session leader of every job, started by the local executor.

Why it exists: a job must outlive a crash of the head, and its exit code must still be known when
the head comes back. The shim is the parent of the user's command, so it alone can reap it; it
writes the exit code to a file the head reads, whether or not the head is still its parent.

Run as a script with only the standard library (python -I -S), so it starts in milliseconds.
usage: _shim.py RUN_DIR WORKDIR -- ARGV...
"""

import json
import os
import signal
import subprocess
import sys


def _write_atomic(path: str, data: dict) -> None:  # type: ignore[type-arg]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def main() -> int:
    run_dir, workdir, sep, *argv = sys.argv[1:]
    assert sep == "--"
    pid = os.getpid()
    _write_atomic(
        os.path.join(run_dir, "shim.json"),
        {"pid": pid, "pgid": os.getpgid(0), "start_ticks": _start_ticks(pid)},
    )
    # Stop signals go to the whole process group: the command must get them, the shim must
    # survive them to record how the command ended. A handler (unlike SIG_IGN) is reset by exec.
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(stop, lambda *_: None)
    sig: int | None
    try:
        proc = subprocess.Popen(argv, cwd=workdir)
    except OSError as e:
        print(f"gpucluster: cannot start {argv[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        code, sig = 127, None
    else:
        rc = proc.wait()
        code, sig = (rc, None) if rc >= 0 else (128 - rc, -rc)
    _write_atomic(os.path.join(run_dir, "exit.json"), {"exit_code": code, "signal": sig})
    return code


if __name__ == "__main__":
    sys.exit(main())
