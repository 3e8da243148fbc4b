"""An image pull with its progress in bytes: what a container job's shim shows while it pulls.

Why bytes and why measured this way: a pull of a multi-GB image can take minutes while the job
holds its GPUs, and "pulling (4 min)" does not say whether it moves. Podman prints no byte counts
when its output is not a terminal (only "Copying blob ..." and "done" per layer), so the shim
measures what lands: podman's image copy writes each layer blob, as received, into a temporary
directory under $TMPDIR before committing it to the store; the pull gets a private, empty TMPDIR
and the sum of the file sizes there is the bytes received so far. The total is the sum of the
layer and config sizes in the image's manifest, which podman itself fetches
(`podman manifest inspect`, with the node's own registries.conf and credentials); when it cannot
(an archive, a registry refusing it), the phase shows the bytes so far alone.

Runs in the shim's job side, as the job's user, with the standard library only (`python -I -S`),
loaded by path as _session.py is. `tell` is the job side's report to the keeper, which keeps
RUN_DIR/phase.json (the head's `preparing: pulling image X (1.2 of 4.0 GB, 12s)`).
"""

import contextlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable

REPORT_EVERY_S = 0.5
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


def amount(done: int, total: int | None) -> str:
    """`1.2 of 4.0 GB` (decimal units, as registries and podman count), or `1.2 GB so far`."""
    scale = total if total else done
    unit, div = next(((u, d) for u, d in (("GB", 1e9), ("MB", 1e6)) if scale >= d), ("kB", 1e3))
    if total:
        return f"{min(done, total) / div:.1f} of {total / div:.1f} {unit}"
    return f"{done / div:.1f} {unit} so far"


def landed(directory: str) -> int:
    """The bytes of every file under `directory` (blobs podman is receiving); 0 if it is gone."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _manifest(podman: str, ref: str, env: dict[str, str]) -> dict | None:  # type: ignore[type-arg]
    """The manifest podman fetches for `ref`. Podman 4.3 refuses a single image's manifest with an
    error that quotes it ("parsing manifest blob "{...}" ...: Treating single images as manifest
    lists is not implemented"); newer ones print it. Either way, podman's own fetch."""
    try:
        done = subprocess.run(
            [podman, "manifest", "inspect", ref],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout if done.returncode == 0 else ""
    if not text and 'manifest blob "' in done.stderr:
        quoted = done.stderr.split('manifest blob "', 1)[1]
        with contextlib.suppress(ValueError):
            text = json.JSONDecoder().raw_decode('"' + quoted)[0]  # the Go %q string, JSON-compatible
    try:
        manifest = json.loads(text)
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) else None


def _repository(ref: str) -> str:
    """`host:5000/a/b:tag@sha256:...` -> `host:5000/a/b`."""
    ref = ref.split("@", 1)[0]
    head, _, last = ref.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def image_size(podman: str, ref: str, env: dict[str, str]) -> int | None:
    """Bytes a pull of `ref` receives (layers and config, compressed as stored), or None."""
    manifest = _manifest(podman, ref, env)
    if manifest is not None and isinstance(manifest.get("manifests"), list):  # a list: this node's entry
        arch = _ARCH.get(platform.machine(), platform.machine())
        entry = next(
            (
                m
                for m in manifest["manifests"]
                if isinstance(m, dict) and (m.get("platform") or {}).get("architecture") == arch
            ),
            None,
        )
        digest = entry.get("digest") if entry else None
        manifest = _manifest(podman, f"{_repository(ref)}@{digest}", env) if digest else None
    if manifest is None or not isinstance(manifest.get("layers"), list):
        return None
    try:
        parts = [*manifest["layers"], manifest.get("config") or {}]
        return sum(int(p.get("size") or 0) for p in parts if isinstance(p, dict)) or None
    except (TypeError, ValueError):
        return None


def pull(podman: str, image: str, env: dict[str, str], tell: Callable[[str], None]) -> tuple[int, bytes, bytes]:
    """`podman pull --quiet IMAGE`, calling `tell("1.2 of 4.0 GB")` as bytes land (at most every
    REPORT_EVERY_S, only on a change); podman's exit code, stdout and stderr. Raises OSError when
    podman cannot be started. The private TMPDIR is removed afterwards."""
    base = env.get("TMPDIR") or "/var/tmp"
    try:
        scratch = tempfile.mkdtemp(prefix="gpucluster-pull-", dir=base)
    except OSError:
        scratch = tempfile.mkdtemp(prefix="gpucluster-pull-")
    try:
        total: list[int | None] = [None]
        archive = image.startswith(("docker-archive:", "oci-archive:"))
        if archive:
            with contextlib.suppress(OSError):
                total[0] = os.path.getsize(image.split(":", 1)[1].split(":", 1)[0])
            sizer = None
        else:
            sizer = threading.Thread(target=lambda: total.__setitem__(0, image_size(podman, image, env)), daemon=True)
            sizer.start()
        proc = subprocess.Popen(
            [podman, "pull", "--quiet", image],
            env={**env, "TMPDIR": scratch},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        outputs: list[tuple[bytes, bytes]] = []
        reader = threading.Thread(target=lambda: outputs.append(proc.communicate()), daemon=True)
        reader.start()
        said, most = "", 0
        while True:
            reader.join(REPORT_EVERY_S)
            if not reader.is_alive():
                break
            most = max(most, landed(scratch))  # blobs leave the dir once committed: keep the peak
            if most:
                text = amount(most, total[0])
                if text != said:
                    tell(text)
                    said = text
        out, err = outputs[0] if outputs else (b"", b"")
        return proc.returncode, out, err
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
