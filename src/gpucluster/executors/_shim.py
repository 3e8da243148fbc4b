"""Job shim: the keeper of one job process, started by the local executor.

Why it exists: a job must outlive a crash of the head, and its exit code must still be known when
the head comes back. The shim is the parent of the user's command, so it alone can reap it; it
writes the exit code to a file the head reads, whether or not the head is still its parent.

usage: python -I -S _shim.py RUN_DIR [--remove-container]
       python -I -S _shim.py --serve   (the fork server: see `serve`)

Everything else comes from RUN_DIR/spec.json, which the executor wrote into the head's own
directory (mode 0600): the command, its environment, workdir, Unix account, log and cgroup. So no
other account on the node sees a job's command or secrets in `ps`, and the shim starts with the
fixed, clean environment the executor gives it, never the job's (a job's LD_PRELOAD must not run
code in a root process). It runs with only the standard library, so it starts in milliseconds.

Two processes, so that the privileged part touches nothing the user controls:
- the *keeper* (this process; root under a root head) reads the spec, forks the job side, waits
  for it, then kills whatever the job left (its cgroup, else its process group) and records
  RUN_DIR/exit.json. It stays outside the job's cgroup, so killing the job never kills the record.
- the *job side* (the forked child) joins the job's cgroup, drops to the job's account
  (initgroups, setgid, setuid) and only then, as the user, applies the environment, makes the
  job's directories, opens its log, enters the workdir and starts the command (posix_spawn: no
  copy of this process); it pumps the command's output into the log in its one thread, and
  reports how the command ended to the keeper through a pipe.

Started two ways, the same keeper either way: exec'd (`python -I -S _shim.py RUN_DIR`), or forked
by the node's fork server (`_shim.py --serve`, started once by the local executor: see `serve`),
which saves each job the ~40 ms of CPU of a Python start. A forked keeper is in a session of its
own, so it outlives the server and the head, and starts with none of the server's fds, with the
same clean environment. The Ray node agent's jobs
(die_with_parent) keep the exec'd shim, whose parent is the agent they must die with.

Signals: the executor signals the keeper (SIGTERM, SIGINT, SIGHUP are passed on to the job;
SIGUSR1 means "SIGKILL the job"). The keeper alone can name the job's process group safely: the
job side is its unreaped child, so that id cannot be reused while the keeper lives.

Log layout: past max_log_bytes/2 bytes the log becomes LOG.1 (the older LOG.1 is dropped) and a
new LOG starts, so at most about max_log_bytes are kept, the newest. LOG.dropped holds how many
bytes were rotated away (what makes the API's offsets count from the attempt's first byte), and a
rotation holds an exclusive flock on LOG.lock (made by the first rotation), which readers take shared
(gpucluster/executors/logfile.py reads this layout; its append_log keeps the head's copy of a Ray
job's log in the same layout with this file's _CappedLog).

A container job (spec "container", built by executors/podman.py): the job side, already the job's
user, makes sure the image is there (`podman image exists`, else `podman pull`: a phase it reports
to the keeper, which keeps RUN_DIR/phase.json while it lasts) and runs `podman run ... IMAGE ARGV`
as its command. The keeper sends a stop to the job side's process group only, where podman passes
it to the container once; a kill also removes the container (`podman rm -f`, run as the job's
user), and so does the end of an attempt whose podman did not end by
itself. `_shim.py RUN_DIR --remove-container` does that removal alone, for the executor's cleanup.

With die_with_parent (the Ray executor's node agent) the job is killed when the agent dies: there
the parent is the node's agent, which dies only with the node's Ray (the head then requeues the
job elsewhere), so the job must not run on unseen, holding GPUs. The keeper watches the agent; the
job side watches the keeper, because Ray SIGKILLs a dying worker's direct children.

An interactive session (spec `session_dir`, executors/_session.py): the job side binds the
session's socket in the run dir before the drop (so only the head can connect), and after it runs
the command on a PTY that it serves there, its output going to the log as a transcript.
"""

import contextlib
import errno
import fcntl
import json
import os
import pwd
import select
import signal
import sys
import time
from typing import Any

SPEC = "spec.json"
EXIT = "exit.json"
PHASE = "phase.json"  # what a running job's process is doing before its command starts (a pull)
# The signal that asks the keeper to SIGKILL the job (SIGKILL itself would kill the keeper).
KILL_REQUEST = signal.SIGUSR1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Exit code of a command that could not be started (the shell's "command not found").
CANNOT_START = 127


def write_json_atomic(path: "str | os.PathLike[str]", data: dict, durable: bool = True) -> None:  # type: ignore[type-arg]
    """A record whole or absent, and only its owner may read it (0600): the package's one atomic
    writer (gpucluster/atomicfile.py: write, fsync, rename, fsync the directory), loaded by path.
    Also the executors' one writer of their records (local.py, ray.py).

    `durable=False` (no fsync) for what a reboot makes meaningless anyway: a job's spec and its
    keeper's pid (spec.json, shim.json) name processes that a power loss ends; the exit record,
    which outlives them, stays durable."""
    _load_sibling("../atomicfile.py").atomic_write_bytes(path, json.dumps(data).encode(), mode=0o600, durable=durable)


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


# ---- cgroup: the job's process tree, found and killed by the kernel's own bookkeeping ----------


_SIBLINGS: dict[str, Any] = {}


def _load_sibling(filename: str) -> Any:
    """A module of the package next to this script (`filename` relative to executors/), by path:
    this script runs outside the package (python -I -S), so it cannot import them by name. Each
    is loaded once per process."""
    import importlib.util

    name = "_gpucluster_" + os.path.basename(filename).removesuffix(".py").lstrip("_")
    if name in _SIBLINGS:
        return _SIBLINGS[name]
    path = os.path.normpath(os.path.join(os.path.dirname(__file__), filename))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    _SIBLINGS[name] = module
    return module


def _load_cgroups() -> Any:
    """executors/cgroups.py: the job's cgroup."""
    return _load_sibling("cgroups.py")


def _load_pull() -> Any:
    """executors/_pull.py: a pull with its progress in bytes."""
    return _load_sibling("_pull.py")


def _load_node_start() -> Any:
    """executors/_node_start.py: a start's node side, before its keeper (the fork server's)."""
    return _load_sibling("_node_start.py")


def _load_session() -> Any:
    """executors/_session.py: interactive sessions, a PTY served on a socket."""
    return _load_sibling("_session.py")


# ---- the job side: runs as the job's user -----------------------------------------------------


class _CappedLog:
    """The command's output, written in segments of `cap // 2` bytes; see the module docstring."""

    def __init__(self, path: str, cap: int) -> None:
        self.path, self.segment = path, max(1, cap // 2)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.size = os.fstat(self.fd).st_size
        try:  # a log written before (the head's copy of a Ray job's log, appended to per chunk)
            with open(f"{path}.dropped") as f:
                self.dropped = int(f.read() or 0)
        except (FileNotFoundError, ValueError):
            self.dropped = 0
        # No PATH.lock yet (issue 18: a file creation per job start): the first rotation makes it
        # before it moves anything, and a reader that found none reads again if one appeared
        # meanwhile (logfile.py `_consistent`). Most logs never rotate.

    def close(self) -> None:
        os.close(self.fd)

    def write(self, data: bytes) -> None:
        while data:
            if self.size >= self.segment:
                self._rotate()
            n = os.write(self.fd, data[: self.segment - self.size])
            self.size += n
            data = data[n:]

    def _rotate(self) -> None:
        """Under the readers' lock (made by the first rotation, before anything moves): PATH ->
        PATH.1, a new PATH, PATH.dropped updated.

        Safe to retry after a failure (a full disk): the dropped count is written before
        anything moves, and a PATH already moved by an earlier try is not counted again.
        """
        lock = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(self.path):  # not yet moved by an earlier, failed try
                older = f"{self.path}.1"
                dropped = self.dropped + (os.stat(older).st_size if os.path.exists(older) else 0)
                with open(f"{self.path}.dropped.tmp", "w") as f:
                    f.write(str(dropped))
                os.replace(self.path, older)
                os.replace(f"{self.path}.dropped.tmp", f"{self.path}.dropped")
                self.dropped = dropped
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        finally:
            os.close(lock)  # releases the flock
        os.close(self.fd)
        self.fd, self.size = fd, 0


# After the command has ended, how long its output pipe may stay open (held by a background
# child) before its exit is reported anyway: the keeper then kills what is left.
DRAIN_S = 2.0


def _inheritable_fds() -> list[int]:
    """This process's fds past stdin, stdout and stderr that an exec would keep open."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):  # the listing's own fd, closed by now
            if fd > 2 and os.get_inheritable(fd):
                fds.append(fd)
    return fds


def _may_be_there(path: str) -> bool:
    """False only where `path` is certainly not there (ENOENT or ENOTDIR, as a spawn would fail)."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def _spawn_command(argv: list[str], env: dict[str, str], out: int) -> int:
    """Start the command as subprocess.Popen did, and cheaper (issue 18): posix_spawn, a vfork
    that copies none of this Python process's memory, instead of a fork, and no thread.

    As Popen: a bare name is looked up on the job's own PATH (the first exec error other than
    "not there" wins), stdin is /dev/null and stdout and stderr go to `out`, SIGPIPE and SIGXFSZ
    (which Python ignores) are back to their defaults, and no other fd of this process reaches
    the command (close_fds): Python makes its own close-on-exec, and any other is closed."""
    exe = argv[0]
    paths = [exe] if os.path.dirname(exe) else [os.path.join(d, exe) for d in os.get_exec_path(env)]
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out, 1),
        (os.POSIX_SPAWN_DUP2, out, 2),
        *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds()),
    ]
    failed: OSError | None = None  # the first error other than "not there"
    missing: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    for path in paths:
        # A PATH entry without the name is passed over with one stat, not a spawn: each spawn is a
        # vfork whose child resets every signal handler before its exec fails (~130 system calls),
        # and a submitter's PATH often lists several directories before the one (issue 18: 8
        # failed spawns per `true` under root's PATH). Only "not there" is passed over: any
        # other answer (a directory it may not search) is left to the spawn to report, as before.
        if len(paths) > 1 and not _may_be_there(path):
            continue
        try:
            return os.posix_spawn(path, argv, env, file_actions=actions, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                missing = e
            elif failed is None:
                failed = e
    raise failed or missing


def _wait_for(pid: int, stops: list[int]) -> tuple[int, bool]:
    """The command's wait status, and whether a stop had reached the job by then: taken the
    moment the wait returns, so a stop that comes after the command's end by itself (into the
    group it left) does not count as stopping it."""
    _, status = os.waitpid(pid, 0)
    return status, bool(stops)


def _pump_until_exit(read_fd: int, log: _CappedLog, pid: int, stops: list[int]) -> tuple[int, bool]:
    """The command's output into the log, in this one thread (no pump thread: issue 18), until
    the command has ended and its pipe is closed, or DRAIN_S after its end (a background child
    that holds the pipe does not hold the record up); then `_wait_for`'s answer.

    A pidfd wakes this loop at the command's end; without one (a kernel before 5.3) it looks
    every 100 ms. A full disk must not stop the job (nor this pump, or the job would block on a
    full pipe): its output is dropped until the log can be written again."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    if pidfd >= 0:
        poller.register(pidfd, select.POLLIN)
    ended: tuple[int, bool] | None = None
    drained_by = 0.0  # once the command has ended
    try:
        while True:
            if ended is None and pidfd < 0 and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                ended, drained_by = _wait_for(pid, stops), time.monotonic() + DRAIN_S
            if ended is not None:
                left = drained_by - time.monotonic()
                if left <= 0:  # even while a background child still writes
                    break
                timeout: float | None = left * 1000
            else:
                timeout = None if pidfd >= 0 else 100
            events = poller.poll(timeout)
            if ended is None and any(fd == pidfd for fd, _ in events):
                poller.unregister(pidfd)
                ended, drained_by = _wait_for(pid, stops), time.monotonic() + DRAIN_S
            if any(fd == read_fd for fd, _ in events):
                try:
                    data = os.read(read_fd, 1 << 16)
                except OSError:
                    data = b""
                if not data:
                    break
                with contextlib.suppress(OSError):
                    log.write(data)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return ended if ended is not None else _wait_for(pid, stops)


def _account_env(account: pwd.struct_passwd) -> dict[str, str]:
    return {"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name}


def _drop_privileges(user: str) -> dict[str, str]:
    """Become `user` for good (groups first, uid last); the variables that name the account."""
    account = pwd.getpwnam(user)
    os.setgroups(os.getgrouplist(account.pw_name, account.pw_gid))
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    if os.getuid() != account.pw_uid or os.geteuid() != account.pw_uid:
        raise PermissionError(f"could not become {user}")
    return _account_env(account)


def _watch_keeper(keeper: int) -> None:
    """die_with_parent: the keeper was SIGKILLed with the agent; kill this whole job."""
    while os.getppid() == keeper:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)


# ---- containers: the job's command through `podman run` (executors/podman.py builds the options)


def _container_env(container: dict, env: dict) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """The job's environment as the container sees it, and podman's own (the job's, which `-e NAME`
    reads values from, plus the node's podman config, which the job cannot override)."""
    env = {**env, **container.get("env_changes", {})}
    # podman finds its helpers (newuidmap, runc) on PATH, whatever the submitter's PATH holds;
    # the container never sees this PATH (the image's is used: executors/podman.py).
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    path = f"{env['PATH']}:{system}" if env.get("PATH") else system
    return env, {**env, "PATH": path, **container.get("config_env", {})}


def _ensure_image(container: dict, env: dict, note: Any, tell: Any) -> tuple[str, float | None, str | None]:  # type: ignore[type-arg]
    """The image to run (as given, or the id an archive loaded as), the seconds a pull took (None
    when it was already here), and why it cannot be had (None when it can). The pull is a phase
    the keeper records in RUN_DIR/phase.json while it lasts, for the head to show. Runs as the
    job's user: what it imports was loaded before the drop (`_job_side`)."""
    podman, image = container["podman"], container["image"]
    import subprocess  # loaded before the drop (`_job_side`); not in the fork server: see `_preload`

    archive = image.startswith(("docker-archive:", "oci-archive:", "oci:"))
    if not archive:
        local = image.removeprefix("docker://")  # how the store names it
        try:
            here = subprocess.run(
                [podman, "image", "exists", local], env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False
            )
        except OSError as e:
            return image, None, f"cannot run podman ({podman}) on this node: {e.strerror}"
        if here.returncode == 0:
            return image, None, None
    note(f"preparing: pulling image {image}")
    tell({"phase": f"pulling image {image}"})
    started = time.monotonic()
    phase = f"pulling image {image}"
    try:
        code, stdout, stderr = _load_pull().pull(
            podman, image, env, lambda progress: tell({"phase": phase, "progress": progress})
        )
    except OSError as e:
        return image, None, f"cannot run podman ({podman}) to pull image {image}: {e.strerror}"
    finally:
        tell({"phase": None})
    pull_s = round(time.monotonic() - started, 3)
    if code != 0:
        lines = stderr.decode(errors="replace").strip().splitlines()
        lines = lines or [f"podman pull exit code {code}"]
        return image, pull_s, f"cannot pull image {image}: {lines[-1].removeprefix('Error: ')}"
    ids = stdout.decode().split()
    return (ids[-1] if archive and ids else image), pull_s, None


def remove_container(spec: dict) -> bool:  # type: ignore[type-arg]
    """`podman rm -f` of the job's container, as the job's account (the container is in that
    account's podman; its groups, gid and uid are set in the child before the exec, the way
    _drop_privileges does), so nothing of it runs on; True when it is gone."""
    container = spec.get("container")
    if not container:
        return True
    import subprocess  # only here, not in the fork server: see `_preload`

    try:
        account = pwd.getpwnam(spec["user"]) if spec.get("user") else pwd.getpwuid(os.getuid())
    except KeyError:
        return False  # the account is gone, and its podman store with it
    drop: dict = {}  # type: ignore[type-arg]
    if spec.get("user"):
        groups = os.getgrouplist(account.pw_name, account.pw_gid)
        drop = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": groups}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_account_env(account), **container.get("config_env", {})}
    argv = [container["podman"], "rm", "--force", "--ignore", "--time", "0", container["name"]]
    try:
        done = subprocess.run(
            argv, env=env, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, check=False, **drop
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _job_side(spec: dict, report: int, keeper: int) -> int:  # type: ignore[type-arg]
    """The forked child: cgroup, drop, then everything the user controls; returns its exit code.

    Reports {"exit_code", "signal", "stopped"} (or {"error"}) to the keeper on `report`.
    `stopped`: a stop signal (SIGTERM, ...) had reached the job before its command ended. The job
    side is in the job's process group and cgroup, so a stop reaches it when it reaches the
    command; taken as soon as the command's wait returns, it tells a command that ended on its
    own from one that ended because it was stopped. The head needs that: a stop it sends just
    as the command ends by itself lands in an empty group, and a job that finished first must
    not be requeued as preempted."""
    os.chdir("/")  # a forked keeper's cwd is the head's run dir: nothing of the job's starts there
    stops: list[int] = []
    for stop in STOP_SIGNALS:
        signal.signal(stop, lambda signum, _: stops.append(signum))
    os.setsid()  # the job's own process group: what the keeper signals where there is no cgroup

    def tell(record: dict) -> None:  # type: ignore[type-arg]
        with contextlib.suppress(OSError):
            os.write(report, json.dumps(record).encode() + b"\n")

    try:
        if spec.get("cgroup"):
            _load_cgroups().join(spec["cgroup"])  # as root, before the drop: a user cannot leave it
    except OSError as e:
        tell({"error": f"cannot put the job in its cgroup: {e}"})
        return CANNOT_START
    session = _load_session() if spec.get("session_dir") else None
    try:  # in the head's run dir, before the drop: only the head can connect (see _session.py)
        listener = session.bind_at(spec["session_dir"]) if session is not None else None
    except OSError as e:
        tell({"error": f"cannot open the session's socket: {e}"})
        return CANNOT_START
    # What this side runs after the drop, imported before it: the interpreter's own files may be
    # readable by root alone (a Python under /root), and the fork server loads none of it.
    if spec.get("container"):
        _load_pull()  # with subprocess and threading
    if spec.get("die_with_parent"):
        import threading
    try:
        account_env = _drop_privileges(spec["user"]) if spec.get("user") else _account_env(pwd.getpwuid(os.getuid()))
    except (OSError, KeyError) as e:
        tell({"error": f"cannot become the job's user {spec.get('user')!r}: {e}"})
        return CANNOT_START
    # --- from here on, only the job's user's rights ---
    os.umask(0o022)  # a login's default, not the head's private 077 (its logs are made 0600 anyway)
    if spec.get("die_with_parent"):
        import threading  # loaded before the drop (above): not in the fork server, see `_preload`

        threading.Thread(target=_watch_keeper, args=(keeper,), daemon=True).start()
    env = {**spec["env"], **account_env}
    log_path, cap = spec["log"], int(spec.get("max_log_bytes") or 0)
    try:
        for d in [os.path.dirname(log_path), *spec.get("make_dirs", [])]:
            os.makedirs(d, mode=0o700, exist_ok=True)
        log = _CappedLog(log_path, cap if cap > 0 else 1 << 62)
    except OSError as e:
        tell({"error": f"cannot write the job's log {log_path}: {e.strerror or e}"})
        return CANNOT_START

    def note(message: str) -> None:  # a line of ours in the job's log
        with contextlib.suppress(OSError):
            log.write(f"gpucluster: {message}\n".encode())

    def fail(message: str, final: bool = False, **extra: object) -> int:
        note(message)
        record = {"exit_code": CANNOT_START, "signal": None, "error": message, **extra}
        tell(record | ({"final": True} if final else {}))
        return CANNOT_START

    if spec["workdir"] == "~":
        spec["workdir"] = env.get("HOME") or "/"
    try:
        os.chdir(spec["workdir"])
    except OSError as e:
        who = f" as {spec['user']}" if spec.get("user") else ""
        return fail(f"cannot enter the workdir {spec['workdir']}{who}: {e.strerror}")
    argv = spec["argv"]
    container = spec.get("container")
    extra: dict = {}  # type: ignore[type-arg]
    if container:
        env, podman_env = _container_env(container, env)
        image, pull_s, problem = _ensure_image(container, podman_env, note, tell)
        if pull_s is not None:
            extra["pull_s"] = pull_s
        extra["container_ended"] = True  # none started yet
        if problem is not None:
            return fail(problem, final=True, **extra)
        if stops:  # stopped while the image was pulled: the command never starts
            tell({"exit_code": 128 + stops[0], "signal": stops[0], "stopped": True, **extra})
            return 128 + stops[0]
        argv = [container["podman"], "run", *container["options"], image, *argv]
        env = podman_env
    if session is not None:  # an interactive session: the command on a PTY, served on the socket
        code, sig = session.serve(listener, argv, env, log, stops, relay_signals=not spec.get("cgroup"))
        tell({"exit_code": code, "signal": sig, "stopped": bool(stops)})
        return int(code)
    read_fd, out = os.pipe()
    try:
        pid = _spawn_command(argv, env, out)
    except OSError as e:
        os.close(read_fd)
        return fail(f"cannot start {argv[0]!r}: {e.strerror}")
    finally:
        os.close(out)
    if stops:
        # A stop (a preemption, a cancel) sent while the command was being started reached
        # only this process, or the command before its exec: without this it would run on.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, stops[0])
    # All of the command's output is in the log before its exit is recorded; background
    # children still holding the pipe do not hold the record up (the keeper kills them).
    status, stopped = _pump_until_exit(read_fd, log, pid, stops)
    os.close(read_fd)
    rc = os.waitstatus_to_exitcode(status)
    code, sig = (rc, None) if rc >= 0 else (128 - rc, -rc)
    if container:
        # podman run returned the container's own code (not its own 125-127, nor a signal to
        # podman itself): the container has ended and --rm removed it.
        extra["container_ended"] = 0 <= rc < 125 or rc > 127
        if 128 < code <= 128 + 64:
            sig = code - 128  # podman run says a signal's end as the shell does: 128 + N
    tell({"exit_code": code, "signal": sig, "stopped": stopped, **extra})
    return code


# ---- the keeper: runs as the head's user (root under a root head) -----------------------------


class _Keeper:
    def __init__(self, run_dir: str, spec: dict, orphan: bool = False) -> None:  # type: ignore[type-arg]
        self.run_dir, self.spec = run_dir, spec
        # Started by the fork server, detached: no parent waits for its exit status, so the
        # record is the only way the head learns how the job ended (see _save).
        self.orphan = orphan
        self.cgroup = _load_cgroups().JobCgroup.from_json(spec["cgroup"]) if spec.get("cgroup") else None
        self.child = 0
        self.parent = os.getppid()
        self.pending: list[int] = []  # stops that came before the job side existed
        self.killed = False  # a kill was asked for: a container job's container is removed
        self.phase: tuple[str, float] | None = None  # the phase being reported, since when

    def on_signal(self, signum: int, _frame: object) -> None:
        kill = signum == KILL_REQUEST
        if not self.child:
            self.pending.append(signum)
            return
        self.send(signal.SIGKILL if kill else signum)

    def send(self, signum: int) -> None:
        """Once to every process of the job: its cgroup's members, else its process group.

        Once: a second SIGTERM a moment after the first would kill what the job's own handler of
        the first one starts (a shell trap's `$(date)`). A container job's stop goes to `podman
        run` alone, which passes it on to the container once; its kill removes the container."""
        if self.spec.get("container"):
            if signum == signal.SIGKILL:
                self.killed = True
                import threading  # loaded by `run` already

                threading.Thread(target=remove_container, args=(self.spec,), daemon=True).start()
            elif self.cgroup is None or self.child in self.cgroup.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.child, signum)
                return
            else:  # not yet in its cgroup nor its own group: it keeps the stop for its command
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child, signum)
                return
        if self.cgroup is not None:
            joined = self.child in self.cgroup.pids()
            self.cgroup.signal(signum)
            if not joined:  # just forked, not in its cgroup yet: it keeps the stop for its command
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child, signum)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child, signum)  # our unreaped child leads it: the id is still the job's

    def watch_parent(self) -> None:
        while os.getppid() == self.parent:
            time.sleep(0.5)
        self.send(signal.SIGKILL)

    def run(self, start_ticks: int | None = None) -> int:
        """Start the job side, keep it, record its end; the job's exit code. `start_ticks`: this
        process's start time, where the caller read it already."""
        for stop in (*STOP_SIGNALS, KILL_REQUEST):
            signal.signal(stop, self.on_signal)
        self.parent = os.getppid()
        pid = os.getpid()
        read_fd, report = os.pipe()
        keeper = os.getpid()
        child = os.fork()
        if child == 0:
            code = 1
            try:
                os.close(read_fd)
                signal.signal(KILL_REQUEST, signal.SIG_DFL)
                code = _job_side(self.spec, report, keeper)
            finally:
                os._exit(code)
        os.close(report)
        self.child = child
        if self.spec.get("container") or self.spec.get("die_with_parent"):
            # Their threads' modules, loaded now rather than in a signal handler (a kill's
            # container removal); not in the fork server: see `_preload`.
            import subprocess  # noqa: F401
            import threading

            if self.spec.get("die_with_parent"):
                threading.Thread(target=self.watch_parent, daemon=True).start()
        write_json_atomic(
            os.path.join(self.run_dir, "shim.json"),
            {
                "pid": pid,
                "pgid": os.getpgid(0),
                "start_ticks": _start_ticks(pid) if start_ticks is None else start_ticks,
                "job_pgid": child,
            }
            | ({"cgroup": self.cgroup.to_json()} if self.cgroup is not None else {})
            | ({"container": self.spec["container"]["name"]} if self.spec.get("container") else {}),
            durable=False,
        )
        for signum in self.pending:
            self.send(signal.SIGKILL if signum == KILL_REQUEST else signum)
        pending, final = b"", b""
        while True:
            try:
                data = os.read(read_fd, 1 << 16)
            except InterruptedError:
                continue
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                final = line if not self._phase(line) else final
        if pending and not self._phase(pending):
            final = pending
        os.close(read_fd)
        # The job side has ended (or is ending) but stays unreaped: its group id cannot be reused
        # while whatever the job left behind is killed.
        while True:
            try:
                os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)
                break
            except ChildProcessError:
                break
            except InterruptedError:
                continue
        used = {}
        if self.cgroup is not None:
            if self.cgroup.pids():  # what the command left behind (most jobs leave nothing)
                self.cgroup.kill()
            # After the kill, so what the leftovers used counts too (a cgroup keeps its totals).
            usage = self.cgroup.usage()
            used = {"cpu_s": usage.cpu_s, "memory_peak_bytes": usage.memory_peak_bytes}
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
        _, status = os.waitpid(child, 0)
        if self.cgroup is not None:  # emptied above and read: removed here, on the node, not by the head
            with contextlib.suppress(OSError):
                self.cgroup.remove()
        record = {**self._record(final, status), **used}
        if self.spec.get("container"):
            # podman run ended by itself with the container's own code: --rm removed it. Else
            # (killed, or podman's own failure, 125-127) nothing of it may run on.
            record["container_gone"] = (not self.killed and record.pop("container_ended", False)) or remove_container(
                self.spec
            )
        self._save(record)
        return int(record["exit_code"])

    def _phase(self, line: bytes) -> bool:
        """A phase report of the job side ({"phase": "pulling image ...", "progress": "1.2 of 4.0
        GB"}, or null when it ends):
        RUN_DIR/phase.json while it lasts. False for any other line (the final report)."""
        try:
            message = json.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or "phase" not in message:
            return False
        path = os.path.join(self.run_dir, PHASE)
        with contextlib.suppress(OSError):
            if message["phase"]:
                phase = str(message["phase"])[:500]
                if self.phase is None or self.phase[0] != phase:  # a progress report keeps its phase's start
                    self.phase = (phase, time.time())
                record = {"phase": phase, "since": self.phase[1]}
                if message.get("progress"):
                    record["progress"] = str(message["progress"])[:100]
                write_json_atomic(path, record)
            else:
                self.phase = None
                os.unlink(path)
        return True

    @staticmethod
    def _record(reported: bytes, status: int) -> dict:  # type: ignore[type-arg]
        try:
            record = dict(json.loads(reported)) if reported else {}
        except ValueError:
            record = {}
        if "exit_code" not in record:
            # Killed before it could report (a SIGKILL to the job): its own wait status.
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            code = 128 + sig if sig is not None else os.waitstatus_to_exitcode(status)
            record = {"exit_code": code, "signal": sig, **({"error": record["error"]} if "error" in record else {})}
        return record

    def _save(self, record: dict) -> None:  # type: ignore[type-arg]
        """exit.json, retried while the disk is full unless the head that started us still waits
        (it reads our exit status, which is the command's). An orphan keeps trying, so a head that
        comes back later still learns how the job ended."""
        while True:
            try:
                write_json_atomic(os.path.join(self.run_dir, EXIT), record)
                return
            except OSError:
                if not self.orphan and os.getppid() == self.parent != 1:
                    return
                if not os.path.isdir(self.run_dir):  # removed with its attempt: no one can read it
                    return
                time.sleep(1.0)


# ---- the fork server: a keeper per job without a Python start per job ---------------------------


def _keeper_of(run_dir: str, report: int, go: int) -> None:
    """The keeper, in a child of the fork server; never returns.

    It is the same keeper an exec'd shim runs, in the same state: the server is this script with
    nothing else loaded, started with the shim's clean environment, cwd and umask. Before the
    keeper starts, whatever the server held goes: every fd but a fresh stdin, stdout and stderr
    (/dev/null), so the job inherits nothing of the server's nor the head's. A keeper that fails
    writes why to RUN_DIR/shim.log, made only then (issue 18: a file creation per job start, on a
    path where the keeper itself prints nothing). Its cwd is RUN_DIR (the head's, 0700): the one
    mark that names its job to a process listing (its command line is the server's); the job side
    leaves it at once.

    It starts nothing before the server says "g" on `go`, which the server does only once the head
    has its reply (the keeper's pid) in its pipe: a server that dies or is killed in between
    leaves a keeper that ends at once, never a job the head does not know of (see `_spawn`).
    """
    code = 1
    try:
        pid = os.getpid()
        os.chdir(run_dir)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        # Who the keeper is, before anything can end it: its pid and start time name it safely.
        ticks = _start_ticks(pid)
        os.write(report, f"{pid} {ticks}\n".encode())
        os.close(report)
        if os.read(go, 1) != b"g":
            code = 0
            return
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
        with open(SPEC) as f:
            spec = json.load(f)
        code = _Keeper(run_dir, spec, orphan=True).run(ticks)
    except BaseException:  # a keeper's failure goes to its shim.log, never upward
        import traceback

        with contextlib.suppress(Exception):
            fd = os.open(
                os.path.join(run_dir, "shim.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
            )
            try:
                os.write(fd, traceback.format_exc().encode())
            finally:
                os.close(fd)
    finally:
        os._exit(code)


def _spawn(run_dir: str, replies: int) -> None:
    """Fork a keeper for RUN_DIR in a session of its own, as an exec'd shim is, and tell the head
    on `replies`: b"PID TICKS\n" (or b"error WHY\n").

    The keeper outlives this server and the head (no signal of theirs reaches it, and it waits for
    nobody). It is this server's child, reaped here when it ends (`_reap`), so no keeper is left a
    zombie even under a head that runs as PID 1 and reaps no orphans; one whose server died is
    init's. It runs the job only after its pid is in the head's pipe (the "g" on `go` follows the
    reply): whatever happens to this server, the head knows every keeper that runs a job, and a
    start it did not hear of started nothing, so a retry cannot run the job twice."""
    read_fd, report = os.pipe()
    go_read, go = os.pipe()
    if os.fork() == 0:
        try:
            os.close(read_fd)
            os.close(go)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's reaper must not take the job side
            os.setsid()  # its own session and process group, led by itself: its pgid is its pid
            _keeper_of(run_dir, report, go_read)
        finally:
            os._exit(1)
    os.close(report)
    os.close(go_read)
    try:
        reply = b""
        while not reply.endswith(b"\n") and (chunk := os.read(read_fd, 64)):
            reply += chunk
        os.close(read_fd)
        if not reply.endswith(b"\n"):
            os.write(replies, b"error the keeper did not start\n")
            return
        os.write(replies, reply)  # one write under PIPE_BUF: the head reads it whole or not at all
        os.write(go, b"g")
    finally:
        os.close(go)  # without the "g": the keeper ends without starting anything


def _reap(_signum: int = 0, _frame: object = None) -> None:
    """The server's SIGCHLD: collect every keeper that has ended."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _preload() -> None:
    """The fork server's state before its first fork: what every keeper and job side needs, and
    nothing more.

    Loaded here, once: loaded in each keeper instead (the atomic writer imports pathlib), it was
    half of a forked keeper's CPU (issue 18). Not loaded: `threading` (nor `subprocess`, which
    imports it), which only container, session and die-with-parent jobs use: once it is imported,
    every os.fork runs its at-fork handlers, and a fork of this process cost 0.8 ms of CPU
    against 0.35 ms without it, twice per job (the keeper and its job side).
    gc.freeze(): what is loaded now stays shared with every keeper (no copy on write of it)."""
    import gc

    _load_sibling("../atomicfile.py")
    _load_cgroups()
    _load_node_start()
    gc.freeze()


def _prepared(line: bytes, replies: int) -> str | None:
    """Do a start's node side (_node_start.py `prepare`: job dir, run dir, cgroup, spec) for a
    JSON request; its run dir, or None after answering b"refused WHY\n" (the start cannot be
    made: the head fails the job with WHY; nothing was forked)."""
    try:
        request = json.loads(line)
        _load_node_start().prepare(request, _load_cgroups(), write_json_atomic)
        return str(request["run_dir"])
    except Exception as e:
        why = " ".join((str(e) or type(e).__name__).split())
        os.write(replies, f"refused {why}\n".encode(errors="replace"))
        return None


def serve(requests: int = 0, replies: int = 1) -> int:
    """The fork server (`_shim.py --serve`): reads starts, one a line, on `requests` (a JSON
    request whose node side it does first, `_prepared`, or a run dir whose spec is written) and
    answers each with its keeper's "PID TICKS" (or "error WHY", or "refused WHY") on `replies`;
    ends at end of input, so it never outlives the executor that started it (the keepers it
    forked do).

    Why: an exec'd shim costs a Python start (~40 ms of CPU) per job; a fork of this small,
    already started process costs about a millisecond, and the keeper it makes is the same code.
    """
    signal.signal(signal.SIGCHLD, _reap)
    _preload()
    pending = b""
    while data := os.read(requests, 1 << 16):  # a SIGCHLD meanwhile: retried (PEP 475)
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            if line.startswith(b"{"):  # a start to prepare first (local.py `start_prepared`)
                run_dir = _prepared(line, replies)
                if run_dir is None:
                    continue
            else:  # a run dir whose spec is written
                run_dir = os.fsdecode(line)
            try:
                _spawn(run_dir, replies)
            except OSError as e:  # the fork itself failed (no memory, no pids): nothing started
                os.write(replies, f"error {e}\n".encode())
    return 0


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return serve()
    run_dir = sys.argv[1]
    with open(os.path.join(run_dir, SPEC)) as f:
        spec = json.load(f)
    if sys.argv[2:] == ["--remove-container"]:  # the executor's cleanup of a keeper that died
        return 0 if remove_container(spec) else 1
    return _Keeper(run_dir, spec).run()


if __name__ == "__main__":
    sys.exit(main())
