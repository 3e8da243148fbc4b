"""A private Podman and a small image built from local files, for the container tests and
bench/bench_containers.py (no registry is reachable here).

The image is a static busybox with the merged-/usr links and empty mount points (`podman import`
of a tarball, a few MB, well under a second); a job brings Python and torch in by --mount. The
Podman has its own containers.conf (what a host that mixes cgroup v1 and v2 needs: cgroupfs,
runc, no default ulimits), image store and run dir, all in one directory, so nothing of the
machine's podman changes.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

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
