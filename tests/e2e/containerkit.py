"""A private Podman and a small image built from local files, for the container tests and
bench/bench_containers.py (no registry is reachable here).

The image is a static busybox with the merged-/usr links and empty mount points (`podman import`
of a tarball, a few MB, well under a second); a job brings Python and torch in by --mount. The
Podman has its own containers.conf (what a host that mixes cgroup v1 and v2 needs: cgroupfs,
runc, no default ulimits), image store and run dir, all in one directory, so nothing of the
machine's podman changes.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

from tests.e2e.headproc import free_port

IMAGE = "localhost/gpucluster-test:1"


def rootfs_tar(path: Path) -> None:
    """/bin/busybox and its applets, the merged-/usr links, and empty mount points."""
    busybox = shutil.which("busybox")
    assert busybox is not None
    with tarfile.open(path, "w") as tar:

        def add_dir(name: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)

        def add_link(name: str, target: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)

        for d in ("bin", "usr", "etc", "tmp", "proc", "sys", "dev", "root", "work"):
            add_dir(d)
        tar.add(busybox, "bin/busybox")
        for applet in ("sh", "echo", "sleep", "cat", "id", "env", "test", "ls", "touch", "date", "true"):
            add_link(f"bin/{applet}", "busybox")
        add_link("lib", "usr/lib")
        add_link("lib64", "usr/lib64")
        info = tarfile.TarInfo("etc/in-image")
        data = b"built by test_containers\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


class Podman:
    """The module's own podman: its config, its store, and a way to ask it things."""

    def __init__(self, root: Path) -> None:
        self.config = root / "config"
        self.config.mkdir(parents=True)
        (self.config / "containers.conf").write_text(
            "[containers]\ndefault_ulimits = []\n"
            f'[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\nevents_logger = "none"\n'
            f'tmp_dir = "{root / "tmp"}"\n'
        )
        (self.config / "storage.conf").write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{root / "graph"}"\nrunroot = "{root / "run"}"\n'
        )
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(self.config / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.config / "storage.conf"),
        }

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=120, check=False)

    def containers(self) -> list[str]:
        return self("ps", "-a", "--format", "{{.Names}}").stdout.split()

    def import_test_image(self, work: Path) -> subprocess.CompletedProcess[str]:
        """IMAGE in this podman's store, from a tarball built in `work`."""
        tar = work / "rootfs.tar"
        rootfs_tar(tar)
        return self("import", str(tar), IMAGE)


# ---- a private registry, and a proxy in front of it that holds a pull half-way ---------------


class Registry:
    """Debian's `docker-registry` (the distribution project's registry 2.x) on a free loopback
    port, with its own config and storage in `root`: a child process stopped by its PID, never
    the system's service. Plain HTTP: the podman that talks to it lists it as insecure in its
    registries.conf (`insecure_registries_conf`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog: {level: error}\n"
            f"storage: {{filesystem: {{rootdirectory: {root / 'store'}}}}}\n"
            f"http: {{addr: 127.0.0.1:{self.port}}}\n"
        )
        binary = shutil.which("docker-registry")
        assert binary is not None
        self.log = open(root / "registry.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([binary, "serve", str(config)], stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float) -> None:
        """Until GET /v2/ answers 200: the registry is serving."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, (self.root / "registry.log").read_text()
            try:
                with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "the registry did not answer /v2/"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def insecure_registries_conf(path: Path, *addresses: str) -> None:
    """What a site does for a registry without TLS: name it insecure in the node's registries.conf
    (`gpucluster up --container-config DIR` passes DIR/registries.conf to every podman)."""
    path.write_text("".join(f'[[registry]]\nlocation = "{a}"\ninsecure = true\n' for a in addresses))


class GatedProxy:
    """A TCP proxy in front of `upstream` that forwards freely until one connection has sent
    `hold_after` bytes to its client, and then holds that connection until `release()`: a pull
    through it stops part-way through its large layer, for as long as a test needs to see it, with
    no timing involved. Small answers (manifests, configs) are never held."""

    def __init__(self, upstream: int, hold_after: int) -> None:
        self.upstream, self.hold_after = upstream, hold_after
        self.gate = threading.Event()
        self.held = threading.Event()  # a connection has reached hold_after
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, up]
            threading.Thread(target=self._pipe, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, gated: bool) -> None:
        sent = 0
        try:
            while data := src.recv(1 << 16):
                if gated and sent >= self.hold_after and not self.gate.is_set():
                    self.held.set()
                    self.gate.wait()
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def release(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.gate.set()
        self.server.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


def big_image_tar(path: Path, layer_bytes: int) -> None:
    """The test image's root file system plus a file of random bytes (incompressible: the pushed
    layer is about `layer_bytes` long, so a pull has something to show progress of)."""
    rootfs_tar(path)
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("random.bin")
        info.size = layer_bytes
        tar.addfile(info, io.BytesIO(os.urandom(layer_bytes)))
