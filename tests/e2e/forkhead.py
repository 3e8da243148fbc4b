"""Start `gpucluster up` many times, fast: fork it from a process that has already imported it.

A head started from the command line spends ~1.2 of its ~1.5 s start on imports (FastAPI,
pydantic models, SQLAlchemy, uvicorn, the CLI's own modules). A test that kills and restarts the
head fifty times spends that on every restart, so it forks each head from a "fork server" that
imported all of it once, built the CLI's commands once and the API once (to warm FastAPI's
caches): the child is a real `gpucluster up` (the CLI's command with its arguments, its own pid,
session and log, killed by pid like any other), started in ~0.3 s.

The fork server has no threads when it forks (checked), so the child is a sound copy.
Protocol on the server's stdin/stdout: one JSON line {"argv": [...], "log": PATH} in, one line
with the child's pid out; {"wait": PID} waits for that child to be gone (all of its threads) and
answers "ok". Exited children are reaped at each request.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.headproc import HeadProcess, pid_alive

# What `gpucluster up` imports on its way to serving, so a forked child imports nothing.
PRELOAD = (
    "gpucluster.cli.main",
    "gpucluster.head.server",
    "gpucluster.api.app",
    "gpucluster.executors.local",
    "gpucluster.telemetry.setup",
    "uvicorn",
    "uvicorn.loops.auto",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
    "pydantic.v1",  # FastAPI imports it while building routes
    "uvicorn.lifespan.on",
)


def _warm() -> None:
    """Build the API once on a throwaway store: what FastAPI and pydantic cache while building
    routes (type hints, schemas) is then ready in every forked head, ~0.1-0.2 s of its start."""
    import tempfile

    from gpucluster.api.app import create_app
    from gpucluster.executors.fake import FakeExecutor
    from gpucluster.head.loop import Head
    from gpucluster.head.paths import DataDir
    from gpucluster.head.service import ClusterService
    from gpucluster.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        data = DataDir(Path(tmp))
        store = Store(data.db)
        try:
            service = ClusterService(
                Head(store=store, executor=FakeExecutor(), data_dir=data, clock=time.time, base_env={})
            )
            try:
                create_app(service)
            finally:
                service.close()
        finally:
            store.close()


def _serve() -> None:  # runs in the fork server
    import importlib
    import threading

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _warm()
    import typer

    from gpucluster.cli.main import app

    # What `gpucluster`'s main() does first on every run: build the click command of every
    # subcommand from its signature (~0.2-0.4 s). Built once here, each head only parses its args.
    cli = typer.main.get_command(app)

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        if req.get("wait"):
            # Until every thread of it is gone: a killed head's main thread shows as a zombie
            # while its other threads still exit, holding its files (the data dir's lock).
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(req["wait"]), 0)
            out.write("ok\n")
            out.flush()
            continue
        assert threading.active_count() == 1, "the fork server must not fork with threads running"
        out.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the head
            code: object = 1
            try:
                os.setsid()
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                null = os.open(os.devnull, os.O_RDONLY)
                log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(null)
                os.close(log)
                import random

                random.seed()  # not the server's sequence
                sys.argv = ["gpucluster", *req["argv"]]
                cli.main(args=req["argv"], prog_name="gpucluster")
                code = 0
            except SystemExit as e:
                code = e.code
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code if isinstance(code, int) else 1)
        out.write(f"{pid}\n")
        out.flush()


class ForkServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tests.e2e.forkhead import _serve; _serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(Path(__file__).resolve().parents[2]),
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the fork server did not start")

    def _ask(self, req: dict[str, object]) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def spawn(self, argv: list[str], log: Path) -> int:
        return int(self._ask({"argv": argv, "log": str(log)}))

    def wait(self, pid: int) -> None:
        self._ask({"wait": pid})

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class ForkedHead(HeadProcess):
    """A HeadProcess whose `gpucluster up` is forked by a ForkServer; handled by pid."""

    def __init__(self, server: ForkServer, data_dir: Path, **kw: object) -> None:
        super().__init__(data_dir, **kw)  # type: ignore[arg-type]
        self.server = server
        self.pid: int | None = None

    def spawn(self) -> None:
        """Start the head, without waiting for it to serve."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.pid = self.server.spawn(self.args[3:], self.log_path)  # after "python -m gpucluster.cli.main"

    def start(self, timeout: float = 20.0) -> HeadProcess:
        self.spawn()
        assert self.pid is not None
        pid = self.pid
        return self.await_health(
            timeout,
            lambda: None if pid_alive(pid) else f"head exited: {self.log_path.read_text()[-3000:]}",
            interval=0.02,
            log_chars=3000,
        )

    @property
    def alive(self) -> bool:
        return self.pid is not None and pid_alive(self.pid)

    def kill9(self) -> None:
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.server.wait(self.pid)

    def stop(self) -> None:
        if self.alive:
            self.kill9()
