"""Runs jobs as local processes, each under a shim (_shim.py) in its own session, and, where the
node allows, in a cgroup of its own (cgroups.py): the kernel's list of every process of the job.

The head signals a job through its shim's keeper, whose identity across head restarts is (pid,
kernel start time), so a recycled pid is never mistaken for a shim; the keeper alone names the
job's process group, and its cgroup, so no process is ever signalled by a remembered number.
The job's command and environment travel in RUN_DIR/spec.json (0600, in the head's own run dir),
never on a command line. Each keeper is forked by the node's fork server (`ForkServer`, issue 18:
a fork instead of a Python start per job); where that cannot be used, or for jobs that die with
this process (die_with_parent), it is exec'd as before.

A multi-process attempt (ranks) runs one shim per process, each in a session of its own, under
`RUN_DIR/rank-R/`. Before the first one starts, `RUN_DIR/launch.json` records how many there
will be, so after a head crash `recover` can tell a complete launch from one cut short. The
handle lists every rank: {"ranks": [{"rank", "pid", "pgid", "start_ticks", "run_dir"}, ...],
"expected": N, "run_dir": RUN_DIR, "marker": "NAME=VALUE"}.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpucluster.executors import _node_start, cgroups, podman
from gpucluster.executors._shim import EXIT, KILL_REQUEST, SPEC, write_json_atomic
from gpucluster.executors.base import (
    Exited,
    Handle,
    LaunchError,
    LaunchSpec,
    Lost,
    ProcessSpec,
    Running,
    Status,
    as_handle,
    combined,
    expected_processes,
)
from gpucluster.executors.image_cache import ImageCache
from gpucluster.executors.liveness import Liveness, readable

SHIM = Path(__file__).with_name("_shim.py")
MANIFEST = "launch.json"
# The shim starts with this environment and no other: none of the job's (nor the head's) variables
# reach a process that may run as root. The job's environment is in its spec, applied after the drop.
SHIM_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}


def rank_dir(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}"


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None if it is gone or a zombie.

    A zombie has exited: only its exit status waits for a parent to collect it. After a head
    crash the shim's new parent may take a while to reap it, and it must not look alive meanwhile.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (IndexError, ValueError):
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return None


def marked_pids(marker: str) -> list[int]:
    """Processes (of this user) whose environment holds `marker` ("NAME=VALUE"), wherever their
    session: what finds the workers a launcher started in sessions of their own."""
    needle = b"\0" + marker.encode() + b"\0"
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's
            continue
        if needle in b"\0" + environ:
            found.append(int(entry.name))
    return found


def shim_spec(
    *,
    argv: list[str],
    env: dict[str, str],
    workdir: str,
    log: Path,
    user: str | None = None,
    max_log_bytes: int = 0,
    make_dirs: list[str] | None = None,
    die_with_parent: bool = False,
    container: dict[str, Any] | None = None,
    session_dir: Path | None = None,
) -> dict[str, Any]:
    """What the shim in a run dir runs (_shim.py), bar its cgroup (added where the cgroup is
    made: _node_start.py): a file only the head can read, so the command and its environment
    never show in `ps` nor reach another account."""
    spec: dict[str, Any] = {
        "argv": argv,
        "env": env,
        "workdir": workdir,
        "user": user,
        "log": str(log),
        "max_log_bytes": max_log_bytes,
        "make_dirs": make_dirs or [],
        "cgroup": {},
        "die_with_parent": die_with_parent,
    }
    if container:
        spec["container"] = container
    if session_dir is not None:
        spec["session_dir"] = str(session_dir)
    return spec


def write_shim_spec(run_dir: Path, *, cgroup: dict[str, str] | None = None, **fields: Any) -> None:
    """`shim_spec(**fields)` written to RUN_DIR/spec.json (0600), for a shim started by hand."""
    write_json_atomic(run_dir / SPEC, {**shim_spec(**fields), "cgroup": cgroup or {}}, durable=False)


def prepare_here(request: dict[str, Any]) -> dict[str, str] | None:
    """A start's node side (_node_start.py) done in this process: where no fork server does it."""
    try:
        return _node_start.prepare(request, cgroups, write_json_atomic)
    except _node_start.Refused as e:
        raise LaunchError(str(e)) from None


def shim_argv(run_dir: Path | str) -> list[str]:
    """The shim's whole command line: names only the run dir (or `--serve`, the fork server)."""
    return [sys.executable, "-I", "-S", str(SHIM), str(run_dir)]


class ForkServer:
    """The node's one `_shim.py --serve` (see `_shim.serve`): forks each job's keeper (in a session of its own), so
    a job start costs a fork instead of a Python start (issue 18).

    Its requests and replies travel on its stdin and stdout, pipes only this executor holds: it
    ends when they close (this process ended, even by SIGKILL), and no other process can ask it
    for anything. A server that died is started again on the next launch; when that fails too,
    `start` says None and the caller execs a shim as before."""

    # How long a keeper's fork may take before the server is taken for hung (and replaced).
    REPLY_TIMEOUT_S = 30.0

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The running server's pid (None before the first start)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, run_dir: Path) -> tuple[int, int | None] | None:
        """(pid, start ticks) of the keeper forked for `run_dir`, whose spec is written; None
        where no server can, and then no keeper runs the job (the server starts none whose pid
        the head was not given)."""
        path = os.fsencode(os.path.abspath(run_dir))
        if b"\n" in path:
            return None
        return self._start(path + b"\n")

    def start_prepared(self, request: dict[str, Any]) -> tuple[int, int | None] | None:
        """As `start`, the server first doing the start's node side (_node_start.py `prepare`:
        job dir, run dir, cgroup, spec). Raises LaunchError where that refused the start (no
        such account, ...); None where no server could fork, and then the caller does it all."""
        return self._start(json.dumps(request).encode() + b"\n")

    def _start(self, line: bytes) -> tuple[int, int | None] | None:
        with self._lock:
            for _ in range(2):  # the running server, else a new one
                proc = self._running()
                if proc is None:
                    return None
                reply = self._ask(proc, line)
                if reply is not None and reply.startswith(b"refused "):
                    raise LaunchError(reply[len(b"refused ") :].decode(errors="replace").strip())
                if reply is not None and not reply.startswith(b"error"):
                    pid, ticks = reply.split()
                    return int(pid), int(ticks)
                if reply is not None:  # the server is fine; the fork failed (no memory, no pids)
                    return None
                self._stop()
            return None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> subprocess.Popen[bytes] | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        try:
            self._proc = subprocess.Popen(
                shim_argv("--serve"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=SHIM_ENV,
                cwd="/",
                start_new_session=True,  # a terminal's ^C to the head does not reach it
                close_fds=True,
                bufsize=0,
            )
        except OSError:
            return None
        return self._proc

    def _ask(self, proc: subprocess.Popen[bytes], request: bytes) -> bytes | None:
        """The server's one-line reply; None when it is gone or did not answer in time.

        A server that does not answer in time is killed, and then its pipe read to the end: a
        reply it wrote before it died is used (its keeper may run), and without one no keeper
        of this request runs (it starts only after the reply is written: `_shim._spawn`)."""
        assert proc.stdin is not None and proc.stdout is not None
        try:
            view = memoryview(request)
            while view:  # a spec can be larger than the pipe takes at once
                view = view[os.write(proc.stdin.fileno(), view) :]
        except OSError:  # BrokenPipeError: it died before (or while) it read this request
            return None
        reply = b""
        deadline = time.monotonic() + self.REPLY_TIMEOUT_S
        while not reply.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not readable(proc.stdout.fileno(), left):
                break
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                return None  # it died without a reply: its keeper, if any, started nothing
            reply += chunk
        else:
            return reply
        proc.kill()
        proc.wait()
        while chunk := os.read(proc.stdout.fileno(), 256):
            reply += chunk
        return reply if reply.endswith(b"\n") else None

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            proc.wait(timeout=5)  # its input closed: it ends by itself
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LocalExecutor:
    # Interactive sessions (executors/_session.py): the head dials their socket on this machine.
    supports_sessions = True

    def __init__(
        self,
        die_with_parent: bool = False,
        max_log_bytes: int = 0,
        cgroup_support: cgroups.CgroupSupport | None = None,
        instance: str = "head",
        gpu_minors: dict[int, int] | None = None,
        container_node: podman.ContainerNode | None = None,
        image_cache: ImageCache | None = None,
        fork_server: bool = True,
    ) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # > 0: each process's shim writes its log, rotated past this size (_shim.py, logfile.py).
        self.max_log_bytes = max_log_bytes
        self._lock = threading.Lock()
        # Jobs die with this process (the Ray node agent), instead of outliving it (the head).
        self.die_with_parent = die_with_parent
        # Each process of a job in a cgroup of its own, where the node allows (executors/cgroups.py),
        # under gpucluster/<instance>: one name per data dir, so two heads never share job cgroups.
        self.cgroup_support = cgroup_support if cgroup_support is not None and cgroup_support.usable else None
        self.instance = instance
        # Real GPUs: NVML index -> /dev/nvidia<minor>. A job's cgroup may open only its own GPUs
        # (where the node has the v1 devices controller); CUDA_VISIBLE_DEVICES alone fences nothing.
        self.gpu_minors = gpu_minors
        # How this node runs a container job (--image): podman and its config (executors/podman.py).
        self.container_node = container_node or podman.ContainerNode()
        # The node's store's LRU with a size cap (executors/image_cache.py); None: never pruned.
        self.image_cache = image_cache
        # Keepers forked by the node's fork server instead of an exec'd shim each. Not for jobs
        # that die with this process (the Ray node agent): those keepers watch their parent.
        self.fork_server = ForkServer() if fork_server and not die_with_parent else None
        self._liveness = Liveness(start_ticks)  # keepers not ours to poll: asked of their pidfds

    def close(self) -> None:
        """Stop the fork server (its keepers and their jobs run on), and remove this head's parent
        cgroup if no job's is left below it: each data dir has a parent of its own, and every
        stopped head (every test's) left one behind."""
        if self.fork_server is not None:
            self.fork_server.close()
        self._liveness.close()
        if self.cgroup_support is not None:
            with contextlib.suppress(OSError):  # jobs that run on keep it (and their cgroups)
                cgroups.remove_parent(self.cgroup_support, self.instance)

    def launch(self, spec: LaunchSpec) -> Handle:
        if spec.container is not None and self.image_cache is not None and self._own_store(spec.user):
            self.image_cache.launched(str(spec.run_dir), spec.container.image, time.time())
        if spec.processes:
            return self._launch_ranks(spec)
        handle = self._launch_one(
            ProcessSpec(spec.argv, spec.env, spec.run_dir, spec.log_path),
            spec.workdir,
            spec.user,
            cgroups.job_name(spec.job_id, spec.attempt),
            spec.container,
            session=spec.session,
            job_dir=spec.job_dir,
        )
        if spec.marker:  # a session's: its command is in a session of its own (executors/_session.py)
            handle["marker"] = spec.marker
        return handle

    def _container(
        self, container: podman.ContainerSpec, leaf: str, env: dict[str, str], workdir: str, user: str | None
    ) -> dict[str, Any]:
        """The shim's `container` record: how its job side runs the command in the image."""
        if workdir == "~":  # the account's home, as for a bare job
            workdir = pwd.getpwnam(user).pw_dir if user else str(Path.home())
        as_root = (pwd.getpwnam(user).pw_uid if user else os.geteuid()) == 0
        name = podman.container_name(self.instance, leaf)
        node = self.container_node
        options, env_changes = podman.run_options(node, container, name=name, env=env, workdir=workdir, as_root=as_root)
        return {
            "podman": node.podman,
            "image": container.image,
            "name": name,
            "options": options,
            "env_changes": env_changes,
            "config_env": node.config_env,
        }

    def _launch_one(
        self,
        p: ProcessSpec,
        workdir: str,
        user: str | None,
        leaf: str,
        container: podman.ContainerSpec | None = None,
        session: bool = False,
        job_dir: Path | None = None,
    ) -> Handle:
        """One process: its node side (the job dir, run dir, cgroup, spec: _node_start.py) and its
        keeper, both by the fork server where one runs (issue 18: none of that work in the head's
        process), else here, and its keeper exec'd."""
        checkpoints = p.env.get("GPUCLUSTER_CHECKPOINT_DIR")
        spec = shim_spec(
            argv=p.argv,
            env=p.env,
            workdir=workdir,
            user=user,
            log=p.log_path,
            max_log_bytes=self.max_log_bytes,
            make_dirs=[checkpoints] if checkpoints else [],
            die_with_parent=self.die_with_parent,
            container=self._container(container, leaf, p.env, workdir, user) if container is not None else None,
            session_dir=p.run_dir if session else None,
        )
        request: dict[str, Any] = {
            "run_dir": str(p.run_dir),
            "spec": spec,
            "durable": container is not None,  # its cleanup after a crash reads it (podman's leftovers)
            "job_dir": str(job_dir) if job_dir is not None else None,
            "user": user,
            "cgroup": None,
            "gpu_minors": None,
        }
        support = self.cgroup_support
        if support is not None:
            request["cgroup"] = {"support": support.to_json(), "instance": self.instance, "leaf": leaf}
            if self.gpu_minors:  # only its own GPUs (v1 devices): CUDA_VISIBLE_DEVICES alone fences nothing
                visible = [int(i) for i in p.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip().isdigit()]
                request["gpu_minors"] = [self.gpu_minors[i] for i in visible if i in self.gpu_minors]
        forked = self.fork_server.start_prepared(request) if self.fork_server is not None else None
        if forked is None:  # no server, or its fork failed: the same steps here (again is safe)
            prepare_here(request)
        pid, ticks = forked if forked is not None else self._exec_shim(p.run_dir)
        handle: Handle = {"pid": pid, "pgid": pid, "start_ticks": ticks, "run_dir": str(p.run_dir)}
        if support is not None:
            handle["cgroup"] = cgroups.job_paths(support, self.instance, leaf)  # what `create` made
        if container is not None:
            handle["container"] = podman.container_name(self.instance, leaf)
        return handle

    def _exec_shim(self, run_dir: Path) -> tuple[int, int | None]:
        """A shim of its own for one process (a Python start): where no fork server is used."""
        # The shim's own messages (never the job's output) go to the run dir, the head's alone.
        with open(run_dir / "shim.log", "ab") as shim_log:
            proc = subprocess.Popen(
                shim_argv(run_dir),
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                env=SHIM_ENV,
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )
        with self._lock:
            self._children[proc.pid] = proc
        return proc.pid, start_ticks(proc.pid)

    def _launch_ranks(self, spec: LaunchSpec) -> Handle:
        spec.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Durable before the first process exists: a head that dies halfway through this loop
        # leaves a manifest that says how many ranks `recover` should find.
        write_json_atomic(spec.run_dir / MANIFEST, {"ranks": len(spec.processes), "marker": spec.marker})
        handle: Handle = {"ranks": [], "expected": len(spec.processes), "run_dir": str(spec.run_dir)}
        if spec.marker:
            handle["marker"] = spec.marker
        try:
            for rank, p in enumerate(spec.processes):
                leaf = cgroups.job_name(spec.job_id, spec.attempt, rank)
                job_dir = spec.job_dir if rank == 0 else None  # made once, before the first rank
                one = self._launch_one(p, spec.workdir, spec.user, leaf, spec.container, job_dir=job_dir)
                handle["ranks"].append({"rank": rank, **one})
        except (OSError, LaunchError) as e:  # the ranks started so far must not run on alone
            self.signal(handle, signal.SIGKILL)
            self.cleanup(handle)
            why = (e.strerror if isinstance(e, OSError) else None) or e
            raise LaunchError(f"could not start rank {len(handle['ranks'])}: {why}") from e
        return handle

    def recover(self, run_dir: Path) -> Handle | None:
        manifest = _read_json(run_dir / MANIFEST)
        if manifest is None:
            shim = _read_json(run_dir / "shim.json")
            if shim is None:
                return None
            return as_handle({**shim, "run_dir": str(run_dir)})
        ranks: list[Handle] = []
        for rank in range(int(manifest["ranks"])):
            shim = _read_json(rank_dir(run_dir, rank) / "shim.json")
            if shim is not None:
                ranks.append(as_handle({"rank": rank, **shim, "run_dir": str(rank_dir(run_dir, rank))}))
        if not ranks:
            return None
        handle: Handle = {"ranks": ranks, "expected": int(manifest["ranks"]), "run_dir": str(run_dir)}
        if manifest.get("marker"):
            handle["marker"] = manifest["marker"]
        return handle

    def _alive(self, handle: Handle) -> bool:
        pid = int(handle["pid"])
        with self._lock:
            child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        return self._liveness.alive(pid, handle.get("start_ticks"))

    def poll(self, handle: Handle) -> Status:
        if "ranks" in handle:
            return combined(self.poll_ranks(handle))
        return self._poll_one(handle)

    def poll_ranks(self, handle: Handle) -> list[Status]:
        if "ranks" not in handle:
            return [self._poll_one(handle)]
        out: list[Status] = [Lost("this rank was never started")] * expected_processes(handle)
        for r in handle["ranks"]:
            out[int(r["rank"])] = self._poll_one(r)
        return out

    def _poll_one(self, handle: Handle) -> Status:
        if self._alive(handle):
            return Running()
        with self._lock:
            child = self._children.pop(int(handle["pid"]), None)
        record = _read_json(Path(handle["run_dir"]) / EXIT)
        if record is not None:
            return Exited(
                int(record["exit_code"]),
                record.get("signal"),
                record.get("error"),
                cpu_s=record.get("cpu_s"),
                memory_peak_bytes=record.get("memory_peak_bytes"),
                final=bool(record.get("final")),
                pull_s=record.get("pull_s"),
                stopped=record["stopped"] if isinstance(record.get("stopped"), bool) else None,
            )
        if child is not None and child.returncode is not None:
            if child.returncode < 0:  # the shim itself was killed: the job was killed with it
                sig = -child.returncode
                return Exited(128 + sig, sig)
            # It could not write its record (a full disk): its exit status is the command's.
            code = child.returncode
            return Exited(code, code - 128 if code > 128 else None)
        return Lost("the job's process is gone and left no exit code")

    def signal(self, handle: Handle, signum: int) -> None:
        for r in handle.get("ranks", [handle]):
            self._signal_one(r, signum)
        if signum == signal.SIGKILL and "marker" in handle:
            self._kill_marked(handle)

    def _signal_one(self, handle: Handle, signum: int) -> None:
        """Through the shim's keeper, which alone can name the job's process group safely and
        signals the job's cgroup where it has one; once the keeper is gone (killed), straight to
        the job's cgroup, which reaches every process of the job and nothing else."""
        if self._alive(handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(handle["pid"]), KILL_REQUEST if signum == signal.SIGKILL else signum)
        elif handle.get("cgroup"):
            cgroups.JobCgroup.from_json(handle["cgroup"]).signal(signum)

    @staticmethod
    def _own_store(user: str | None) -> bool:
        """Whether a job's podman is this process's account's, whose store the image cache keeps
        (a member's rootless store is the member's own: executors/image_cache.py)."""
        if user is None:
            return True
        try:
            return pwd.getpwnam(user).pw_uid == os.geteuid()
        except KeyError:
            return False

    def cleanup(self, handle: Handle) -> None:
        """Whatever a finished attempt left: its cgroups killed and removed. No process group is
        signalled by number: the shim killed its job's group before recording the exit, while
        the id was still the job's. Then the image cache may prune (in the background)."""
        try:
            self._cleanup(handle)
        finally:
            if self.image_cache is not None and handle.get("run_dir"):
                self.image_cache.cleaned(str(handle["run_dir"]))

    def _cleanup(self, handle: Handle) -> None:
        for r in handle.get("ranks", [handle]):
            if r.get("container"):
                self._remove_container(r)
            if r.get("cgroup"):
                cgroup = cgroups.JobCgroup.from_json(r["cgroup"])
                if cgroup.pids():  # the shim kills it before its record: usually empty by now
                    cgroup.kill()
                with contextlib.suppress(OSError):
                    cgroup.remove()
        self._kill_marked(handle)

    def _remove_container(self, handle: Handle) -> None:
        """A container its keeper did not see gone (the keeper was killed): `podman rm -f` through
        the shim's own code, which drops to the job's account first."""
        run_dir = Path(handle["run_dir"])
        record = _read_json(run_dir / EXIT)
        if (record is not None and record.get("container_gone")) or self._alive(handle):
            return
        subprocess.run(
            [*shim_argv(run_dir), "--remove-container"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=SHIM_ENV,
            cwd="/",
            check=False,
            timeout=120,
        )

    def _kill_marked(self, handle: Handle) -> None:
        marker = handle.get("marker")
        if not marker:
            return
        for pid in marked_pids(str(marker)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
