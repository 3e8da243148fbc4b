"""Job shim: the session leader of every job, started by the local executor.

Why it exists: a job must outlive a crash of the head, and its exit code must still be known when
the head comes back. The shim is the parent of the user's command, so it alone can reap it; it
writes the exit code to a file the head reads, whether or not the head is still its parent.

Run as a script with only the standard library (python -I -S), so it starts in milliseconds.
usage: _shim.py RUN_DIR WORKDIR [--die-with-parent] [--user NAME] -- ARGV...

With --user (a root head running a job as its submitter) the shim stays root, so it can write
its records into the head's run dir, and starts the command as NAME: its uid, gid, groups,
HOME, USER and LOGNAME.

With --die-with-parent (the Ray executor's node agent) the shim kills its whole process group
when its parent dies: there the parent is the node's agent, which dies only with the node's Ray
(the head then requeues the job elsewhere), so the job must not run on unseen, holding GPUs.
"""

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time


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


def _die_with_parent() -> None:
    """Kill the process group when the parent (the agent) dies, or when this shim is killed.

    Two watchers, because Ray kills a dying worker's direct children (this shim) with SIGKILL:
    a thread here sees the agent go, and a forked watchdog in the group (a grandchild of the
    agent, so not killed with it) sees this shim go. Either kills the whole group; after a
    normal end that only reaches the job's leftover background processes, as a cleanup does.
    """
    shim = os.getpid()
    if os.fork() == 0:
        try:
            for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(stop, signal.SIG_IGN)
            while os.getppid() == shim:
                time.sleep(0.5)
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(0)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def main() -> int:
    run_dir, workdir, sep, *argv = sys.argv[1:]
    if sep == "--die-with-parent":
        _die_with_parent()
        sep, argv = argv[0], argv[1:]
    uid = gid = groups = None
    if sep == "--user":
        account = pwd.getpwnam(argv[0])
        sep, argv = argv[1], argv[2:]
        uid, gid = account.pw_uid, account.pw_gid
        groups = os.getgrouplist(account.pw_name, account.pw_gid)
        os.environ.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
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
        proc = subprocess.Popen(argv, cwd=workdir, user=uid, group=gid, extra_groups=groups)
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
